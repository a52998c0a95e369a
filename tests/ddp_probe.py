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

from conftest import FAST, make_cfg, prepared  # noqa: E402

from mlmlab.build import build_module, build_recipe, eval_suffix  # noqa: E402
from mlmlab.data.datamodule import with_attention_mask  # noqa: E402
from mlmlab.pretraining import build_masking_plan, datamodule  # noqa: E402
from mlmlab.train import encoder_config  # noqa: E402

STEPS = 3


class MaskProbe(pl.Callback):
    def __init__(self, probe: dict):
        self.probe, self.trace = probe, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        _, out = module.mask_batch(self.probe, batch_idx)
        self.trace[trainer.global_step] = {"input_ids": out.input_ids.clone(), "labels": out.labels.clone()}


def main(out: Path, cache: Path) -> None:
    cfg = make_cfg([*FAST, "data.val_batch_size=16"], out / "run", cache)
    data = prepared(cfg)  # the job's own stages (mlmlab.train), then a 2-process DDP Trainer of its own
    masking = build_masking_plan(build_recipe(cfg.mask, data.ctx, data.train_blocks), cfg.eval, data)
    dm, val = datamodule(cfg.data, cfg.seed, data, masking.val), masking.val
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module = build_module(cfg.objective, cfg.optim, cfg.seed, eval_suffix(cfg.eval.rate),
                          encoder_config(cfg.model, data.vocab_size, cfg.objective.name), STEPS, masking.recipe)
    probe = with_attention_mask({k: x[:8] for k, x in data.train_blocks.items()})
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
