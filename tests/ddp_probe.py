"""Run as a script by tests/test_performance.py: a real 2-process Lightning DDP fit (gloo, CPU) of the tiny MLM config.

Each rank records, at every training step, the masks its module draws for one fixed probe batch (the same blocks on
both ranks), then validates on the fixed eval masks; rank 0 also computes the fixed-mask loss over the whole validation
set in one process, with the same weights. Writes ``<out>/rank<r>.pt`` and ``<out>/val.json``.

    python tests/ddp_probe.py <out dir> <cache dir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import FAST, make_cfg  # noqa: E402

from mlmlab.config import build_schedule  # noqa: E402
from mlmlab.data.corpus import get_blocks  # noqa: E402
from mlmlab.data.datamodule import PretrainDataModule, with_attention_mask  # noqa: E402
from mlmlab.data.tokenizer import MASK, PAD  # noqa: E402
from mlmlab.data.vocab_stats import make_sampler_context  # noqa: E402
from mlmlab.masking import mask_once  # noqa: E402
from mlmlab.masking.replacement import UniformSampler  # noqa: E402
from mlmlab.models.encoder import EncoderConfig  # noqa: E402
from mlmlab.train import build_masking, build_module  # noqa: E402

STEPS = 3


class MaskProbe(pl.Callback):
    def __init__(self, probe: dict):
        self.probe, self.trace = probe, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        _, out = module.mask_batch(self.probe, batch_idx)
        self.trace[trainer.global_step] = {"input_ids": out.input_ids.clone(), "labels": out.labels.clone()}


def main(out: Path, cache: Path) -> None:
    cfg = make_cfg([*FAST, "data.val_batch_size=16"], out / "run", cache)
    tok, blocks = get_blocks(cfg)
    ctx = make_sampler_context(cfg, tok, blocks)
    v = {k: x[: cfg.data.max_val_blocks] for k, x in blocks["validation"].items()}
    e = cfg.eval
    fixed = mask_once(v["input_ids"], v["special_tokens_mask"], e.rate, MASK,
                      (e.replace.mask, e.replace.random, e.replace.keep), UniformSampler(ctx), e.seed)
    val = {"input_ids": fixed.input_ids, "labels": fixed.labels, "attention_mask": v["input_ids"] != PAD,
           "original_ids": v["input_ids"], "special_tokens_mask": v["special_tokens_mask"]}
    dm = PretrainDataModule(blocks["train"], val, cfg.data.batch_size, cfg.data.val_batch_size, cfg.seed)
    enc = EncoderConfig.from_model_cfg(cfg.model, tok.get_vocab_size()).to_dict()
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module = build_module(cfg, enc, STEPS, build_masking(cfg, ctx, blocks["train"]), build_schedule(cfg.mask))
    probe = with_attention_mask({k: x[:8] for k, x in blocks["train"].items()})
    cb = MaskProbe(probe)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, max_epochs=-1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, callbacks=[cb])
    trainer.fit(module, datamodule=dm)
    torch.save(cb.trace, out / f"rank{trainer.global_rank}.pt")
    trainer.limit_val_batches = 1.0
    (synced,) = trainer.validate(module, datamodule=dm, verbose=False)
    if trainer.global_rank == 0:
        module.eval()
        with torch.no_grad():
            loss, _, targets = module.model.mlm_loss(val["input_ids"], val["attention_mask"], val["labels"])
        json.dump({"synced": synced, "one_process_loss": loss.item(), "eval_tokens": targets.numel(),
                   "val_blocks": len(val["input_ids"])}, (out / "val.json").open("w"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
