"""A run resumed from a checkpoint continues the same mask stream and schedule position as an uninterrupted run."""

import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf

from mlmlab import build_recipe
from mlmlab.data.corpus import get_blocks
from mlmlab.data.datamodule import PretrainDataModule, with_attention_mask
from mlmlab.data.vocab_stats import make_sampler_context
from mlmlab.lit.mlm import MLMModule
from mlmlab.models.encoder import EncoderConfig


class MaskTrace(pl.Callback):
    """Records, at every training step, the masks the module would draw for one fixed probe batch, and the rate."""

    def __init__(self, probe):
        self.probe, self.trace = probe, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        rate, out = module.mask_batch(self.probe, batch_idx)
        self.trace[trainer.global_step] = (rate, out.input_ids.clone(), out.labels.clone())


def fit(cfg, blocks, tok, max_steps, probe, ckpt_in=None, ckpt_out=None):
    ctx = make_sampler_context(cfg.data, cfg.tokenizer, cfg.paths, tok, blocks)
    enc = EncoderConfig.from_model_cfg(cfg.model, tok.get_vocab_size()).to_dict()
    module = MLMModule(enc, build_recipe(cfg.mask, ctx, blocks["train"]), OmegaConf.to_container(cfg.optim), cfg.seed, 6)
    val = {"input_ids": blocks["validation"]["input_ids"][:8], "labels": blocks["validation"]["input_ids"][:8].long(),
           "attention_mask": blocks["validation"]["input_ids"][:8] > 0}
    dm = PretrainDataModule(blocks["train"], val, 8, 8, cfg.seed)
    trace = MaskTrace(probe)
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, limit_val_batches=0, callbacks=[trace], accelerator="cpu",
                         enable_model_summary=False)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_in)
    if ckpt_out:
        trainer.save_checkpoint(ckpt_out)
    return trace.trace


def test_resumed_run_continues_the_mask_stream(cfg_factory, tmp_path):
    for overrides in ([ "mask=ankner_linear"], ["mask=spanbert", "mask.count=prob_round"]):
        cfg = cfg_factory(*overrides)
        tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
        probe = with_attention_mask({k: v[:8] for k, v in blocks["train"].items()})
        full = fit(cfg, blocks, tok, 6, probe)
        first = fit(cfg, blocks, tok, 3, probe, ckpt_out=tmp_path / "mid.ckpt")
        resumed = fit(cfg, blocks, tok, 6, probe, ckpt_in=str(tmp_path / "mid.ckpt"))
        assert sorted(first) == [0, 1, 2] and sorted(resumed) == [3, 4, 5]
        rates = [full[s][0] for s in range(6)]
        assert len(set(rates)) > 1 or overrides[0] != "mask=ankner_linear"  # the schedule moves
        for s in range(6):
            other = first.get(s) or resumed.get(s)
            assert other[0] == full[s][0]
            assert torch.equal(other[1], full[s][1]) and torch.equal(other[2], full[s][2]), s
        assert not torch.equal(full[3][2], full[4][2])  # and the stream does change from step to step
