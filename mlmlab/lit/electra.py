"""ELECTRA pretraining: the masker corrupts the generator's input (every ``mask.*`` axis applies), the generator's
samples fill the masked positions, the discriminator detects replaced tokens. Downstream uses the discriminator."""

from __future__ import annotations

import torch

from mlmlab.lit.mlm import EVAL_SAMPLE_STREAM, SAMPLE_STREAM, MLMModule, log_weighted
from mlmlab.masking import make_generator, telemetry
from mlmlab.models.electra import ElectraForPretraining, rtd_metrics
from mlmlab.models.encoder import EncoderConfig


class ElectraModule(MLMModule):
    """``objective``: generator_size, generator_layers, disc_weight, temperature (+ temperature_end), sampling
    (conf/objective/electra.yaml)."""

    def build_model(self, c: EncoderConfig):
        o = self.hparams.objective
        return ElectraForPretraining(c, o["generator_size"], o.get("generator_layers"), self.masking.special_ids)

    def encoder(self):
        return self.model.discriminator

    def sampling_temperature(self, step: int | None) -> float:
        """The generator's sampling temperature at optimizer step ``step``: ``objective.temperature`` when
        ``temperature_end`` is null; else geometric from ``temperature`` (step 0) to ``temperature_end`` (the last
        step), a pure function of the step, so exact under resume. ``step=None``: the end temperature (validation)."""
        o = self.hparams.objective
        start, end = float(o["temperature"]), o.get("temperature_end")
        if end is None:
            return start
        progress = 1.0 if step is None else min(1.0, step / max(1, self.max_steps - 1))
        return start * (float(end) / start) ** progress

    def _rtd(self, batch, masked_ids, labels, original, generator, temperature: float):
        o = self.hparams.objective
        return self.model(masked_ids, labels, original, batch["attention_mask"], batch["special_tokens_mask"],
                          disc_weight=o["disc_weight"], temperature=temperature, generator=generator,
                          sampling=o["sampling"])

    def training_step(self, batch, batch_idx):
        ids, special = batch["input_ids"], batch["special_tokens_mask"]
        rate, masked = self.mask_batch(batch, batch_idx)
        temperature = self.sampling_temperature(self.global_step)
        out = self._rtd(batch, masked.input_ids, masked.labels, ids, self.mask_generator(batch_idx, SAMPLE_STREAM),
                        temperature)
        with torch.no_grad():
            stats = {f"train/{k}": v for k, v in telemetry(ids, special, masked).items()}
        self.log("train/loss", out.loss.detach(), prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in rtd_metrics(out).items()})
        self.log("train/mask_rate", float(rate), prog_bar=True)
        self.log("train/temperature", temperature)
        self.log_telemetry(stats)
        return out.loss

    def validation_step(self, batch, batch_idx):
        """At the fixed evaluation masks: the generator's MLM loss / accuracy and the discriminator's metrics on the
        generator's samples (drawn from a fixed per-batch stream at the end temperature, so repeated validations are
        comparable and measure the task training ends on)."""
        g = make_generator(self.device, EVAL_SAMPLE_STREAM, batch_idx)
        out = self._rtd(batch, batch["input_ids"], batch["labels"], batch["original_ids"], g,
                        self.sampling_temperature(None))
        m = rtd_metrics(out)
        n_gen, n_disc = max(1, out.gen_targets.numel()), max(1, out.disc_targets.numel())
        s = self.eval_suffix
        log_weighted(self, f"val/gen_mlm_loss_{s}", m["gen_mlm_loss"], n_gen, prog_bar=True)
        log_weighted(self, f"val/gen_acc_{s}", m["gen_acc"], n_gen)
        for k in ("disc_loss", "disc_acc", "replaced_frac"):
            log_weighted(self, f"val/{k}_{s}", m[k], n_disc)
        n_rep = int(out.disc_targets.sum())
        n_orig = out.disc_targets.numel() - n_rep
        # token-weighted over the epoch; a batch with none contributes weight 0 (not a 0 of weight 1). Logged on every
        # batch, never conditionally: under DDP every rank must sync the same keys
        log_weighted(self, f"val/disc_acc_replaced_{s}", m["disc_acc_replaced"], n_rep)
        log_weighted(self, f"val/disc_acc_original_{s}", m["disc_acc_original"], n_orig)
