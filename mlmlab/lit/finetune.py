"""Fine-tuning of an encoder copy: sequence classification, or token classification (NER) with ``token_level``."""

from __future__ import annotations

import pytorch_lightning as pl
import torch.nn.functional as F

from mlmlab.lit.optim import adamw_with_schedule
from mlmlab.models.encoder import EncoderConfig, SequenceClassifier, TokenClassifier


class FinetuneModule(pl.LightningModule):
    def __init__(self, encoder: dict, num_labels: int, lr: float, weight_decay: float, warmup_frac: float,
                 total_steps: int, dropout: float = 0.1, encoder_state: dict | None = None, pooling: str = "mean",
                 token_level: bool = False, layer_decay: float | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["encoder_state"], logger=False)
        c = EncoderConfig(**encoder)
        self.model = TokenClassifier(c, num_labels, dropout) if token_level else SequenceClassifier(c, num_labels,
                                                                                                   dropout, pooling)
        if encoder_state is not None:
            self.model.bert.load_state_dict(encoder_state)

    def forward(self, batch):
        """Logits: ``(batch, labels)``, or ``(batch, seq, labels)`` for token classification."""
        return self.model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        loss = F.cross_entropy(logits.flatten(0, -2), batch["labels"].flatten(), ignore_index=-100)
        self.log("finetune/loss", loss)
        return loss

    def configure_optimizers(self):
        h = self.hparams
        return adamw_with_schedule(self.model, h.lr, h.weight_decay, (0.9, 0.999), 1e-8,
                                   int(h.warmup_frac * h.total_steps), h.total_steps, "linear",
                                   layer_decay=None if h.layer_decay is None else (h.layer_decay,
                                                                                   h.encoder["num_layers"]))
