"""Sequence-classification fine-tuning of an encoder copy."""

from __future__ import annotations

import pytorch_lightning as pl
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from mlmlab.lit.optim import adamw_with_schedule
from mlmlab.models.encoder import EncoderConfig, SequenceClassifier


class FinetuneModule(pl.LightningModule):
    def __init__(self, encoder: dict, num_labels: int, lr: float, weight_decay: float, warmup_frac: float,
                 total_steps: int, dropout: float = 0.1, encoder_state: dict | None = None, pooling: str = "mean"):
        super().__init__()
        self.save_hyperparameters(ignore=["encoder_state"], logger=False)
        self.model = SequenceClassifier(EncoderConfig(**encoder), num_labels, dropout, pooling)
        if encoder_state is not None:
            self.model.bert.load_state_dict(encoder_state)
        self.test_acc = MulticlassAccuracy(num_classes=num_labels, average="micro")

    def forward(self, batch):
        return self.model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch), batch["labels"])
        self.log("finetune/loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        self.test_acc.update(self(batch).argmax(-1), batch["labels"])
        self.log("test/acc", self.test_acc, on_epoch=True)

    def configure_optimizers(self):
        h = self.hparams
        return adamw_with_schedule(self.model, h.lr, h.weight_decay, (0.9, 0.999), 1e-8,
                                   int(h.warmup_frac * h.total_steps), h.total_steps, "linear")
