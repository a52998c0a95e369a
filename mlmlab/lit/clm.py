"""Causal-LM pretraining (``objective=clm``): the same encoder, causal attention, next-token loss. No masking."""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from mlmlab.lit.mlm import log_weighted
from mlmlab.lit.optim import adamw_from_cfg
from mlmlab.models.encoder import CausalLM, EncoderConfig


class CLMModule(pl.LightningModule):
    def __init__(self, encoder: dict, optim: dict, max_steps: int, pad_id: int):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.model = CausalLM(EncoderConfig(**{**encoder, "causal": True}))
        self.max_steps, self.pad_id = max_steps, pad_id

    def encoder(self):
        return self.model.bert

    def _step(self, ids, attention_mask):
        loss, logits, targets = self.model.clm_loss(ids, attention_mask, self.pad_id)
        with torch.no_grad():
            acc = (logits.argmax(-1) == targets).float().mean() if targets.numel() else loss.new_zeros(())
        return loss, acc, max(1, targets.numel())

    def training_step(self, batch, batch_idx):
        loss, acc, _ = self._step(batch["input_ids"], batch["attention_mask"])
        self.log("train/clm_loss", loss, prog_bar=True)
        self.log("train/clm_acc", acc)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, acc, n = self._step(batch["original_ids"], batch["attention_mask"])  # the unmasked validation blocks
        log_weighted(self, "val/clm_loss", loss, n, prog_bar=True)
        log_weighted(self, "val/clm_acc", acc, n)

    def configure_optimizers(self):
        return adamw_from_cfg(self.model, self.hparams.optim, self.max_steps)
