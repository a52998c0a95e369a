"""Masked-language-model pretraining. Masking happens here, on the batch's device, inside ``training_step``."""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from mlmlab.lit.optim import adamw_from_cfg
from mlmlab.masking import GeneratorSource, KeyedSource, MaskingRecipe, make_generator, telemetry
from mlmlab.models.encoder import BertForMLM, EncoderConfig

TRAIN_STREAM = 0  # first seed part of the training mask stream (other streams, e.g. eval, use other tags)
SAMPLE_STREAM, EVAL_SAMPLE_STREAM = 3, 4  # ELECTRA's generator samples: training (seed, rank, step, micro), validation


class MLMModule(pl.LightningModule):
    def __init__(self, encoder: dict, masking: MaskingRecipe, optim: dict, seed: int, max_steps: int,
                 eval_suffix: str = "r15", objective: dict | None = None):
        """``masking``: what this run masks with (``MaskingRecipe.from_config`` of ``mask.*``; mlmlab.train builds it
        once, in its masking stage). The whole run config is logged once by train.py, so the hyperparameters kept here
        are the ones the module itself reads: encoder, optim, seed, max_steps, eval_suffix, objective."""
        super().__init__()
        self.save_hyperparameters(ignore=["masking"], logger=False)
        self.masking = masking
        self.model = self.build_model(EncoderConfig(**encoder))
        self.masker, self.schedule = masking.masker, masking.schedule
        self.seed, self.max_steps, self.eval_suffix = seed, max_steps, eval_suffix
        self.telemetry_sums: dict[str, float] = {}  # realized corruption summed over the run's training batches
        self.telemetry_batches = 0

    def log_telemetry(self, stats: dict) -> None:
        """Log one batch's realized corruption (``train/selected_frac`` ...) and add it to the run's sums."""
        self.log_dict(stats)
        for k, v in stats.items():
            self.telemetry_sums[k] = self.telemetry_sums.get(k, 0.0) + float(v)
        self.telemetry_batches += 1

    def telemetry_means(self) -> dict[str, float]:
        """The run's mean realized corruption per key (over every training batch, a resumed run's included)."""
        n = max(1, self.telemetry_batches)
        return {k: v / n for k, v in self.telemetry_sums.items()}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["mlmlab_telemetry"] = {"sums": dict(self.telemetry_sums), "batches": self.telemetry_batches}
        if hasattr(self.masker.weights, "state"):  # mask.select.weight=loss: the running per-type losses
            checkpoint["mlmlab_select"] = self.masker.weights.state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        t = checkpoint.get("mlmlab_telemetry") or {}
        self.telemetry_sums, self.telemetry_batches = dict(t.get("sums", {})), int(t.get("batches", 0))
        if "mlmlab_select" in checkpoint and hasattr(self.masker.weights, "load"):
            self.masker.weights.load(checkpoint["mlmlab_select"])

    def build_model(self, c: EncoderConfig):
        return BertForMLM(c)

    def encoder(self):
        """The pretrained encoder that downstream fine-tuning copies."""
        return self.model.bert

    def mask_generator(self, batch_idx: int, stream: int = TRAIN_STREAM) -> torch.Generator:
        micro = batch_idx % max(1, self.trainer.accumulate_grad_batches) if self._trainer is not None else 0
        return make_generator(self.device, stream, self.seed, self.global_rank, self.global_step, micro)

    def mask_source(self, batch, batch_idx: int):
        """Dynamic: a generator keyed by (seed, rank, step, micro-batch). Static: keyed by (seed, block, copy)."""
        ids = batch["input_ids"]
        if self.masking.dynamic:
            return GeneratorSource(self.mask_generator(batch_idx), ids.shape[0], ids.device)
        epoch = self.trainer.current_epoch if self._trainer is not None else 0
        return KeyedSource.for_blocks(self.seed, batch["block_id"], epoch % self.masking.static_copies)

    def mask_batch(self, batch, batch_idx: int):
        rate = self.schedule(self.global_step, self.max_steps)
        out = self.masker(batch["input_ids"], batch["special_tokens_mask"], rate, self.mask_source(batch, batch_idx),
                          word_ids=batch.get("word_ids"))
        return rate, out

    def training_step(self, batch, batch_idx):
        ids, special = batch["input_ids"], batch["special_tokens_mask"]
        rate, out = self.mask_batch(batch, batch_idx)
        loss, logits, targets = self.model.mlm_loss(out.input_ids, batch["attention_mask"], out.labels)
        with torch.no_grad():
            acc = (logits.argmax(-1) == targets).float().mean() if targets.numel() else loss.new_zeros(())
            stats = {f"train/{k}": v for k, v in telemetry(ids, special, out).items()}
            if hasattr(self.masker.weights, "update"):  # mask.select.weight=loss: this step's per-type losses
                self.masker.weights.update(targets, torch.nn.functional.cross_entropy(logits.float(), targets,
                                                                                      reduction="none"))
        self.log("train/mlm_loss", loss, prog_bar=True)
        self.log("train/mlm_acc", acc)
        self.log("train/mask_rate", float(rate), prog_bar=True)
        self.log_telemetry(stats)
        return loss

    def validation_step(self, batch, batch_idx):
        ids, labels = batch["input_ids"], batch["labels"]
        loss, logits, targets = self.model.mlm_loss(ids, batch["attention_mask"], labels)
        n = max(1, targets.numel())  # token-weighted mean over the whole fixed-mask set
        acc = (logits.argmax(-1) == targets).float().mean() if targets.numel() else loss.new_zeros(())
        log_weighted(self, f"val/mlm_loss_{self.eval_suffix}", loss, n, prog_bar=True)
        log_weighted(self, f"val/mlm_acc_{self.eval_suffix}", acc, n)
        # the same loss split by what the fixed masks showed at each predicted position: [MASK], a random token, the
        # original kept (a random draw equal to the original counts as kept). Arms trained on other splits or samplers
        # are scored fairly on [MASK] positions; an arm that never saw a random or kept token errs at those.
        shown = ids[labels != -100]
        per_token = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
        mask_id = self.masking.masker.mask_token_id
        for kind, at in (("mask", shown == mask_id), ("random", (shown != mask_id) & (shown != targets)),
                         ("keep", shown == targets)):
            k = int(at.sum())  # every batch logs every kind (k may be 0), so DDP ranks stay in step
            log_weighted(self, f"val/mlm_loss_at_{kind}_{self.eval_suffix}", per_token[at].sum() / max(k, 1), k)

    def configure_optimizers(self):
        return adamw_from_cfg(self.model, self.hparams.optim, self.max_steps)


def log_weighted(module: pl.LightningModule, name: str, value, n, **kw) -> None:
    """Log ``value`` as an epoch mean weighted by ``n`` (tokens), synced exactly across DDP ranks: sum(value x n) /
    sum(n) over every rank's batches. ``n`` goes in as a float because Lightning's gloo "mean" sync divides an integer
    count by the world size in integer arithmetic (701 tokens on 2 ranks -> 350), which skews the synced mean."""
    module.log(name, value, batch_size=float(n), sync_dist=True, **kw)
