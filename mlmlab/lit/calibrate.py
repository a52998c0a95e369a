"""``trainer.budget.seconds``: turn a wall-clock budget into a step count before training.

A short timing probe trains a throw-away copy of the job's module (same shapes, precision, batch and masking, on real
training batches) for a few steps and runs one validation pass; the step count that fills the budget follows from the
measured seconds per step and per validation. The run itself is then an ordinary ``max_steps`` run: its lr and
mask-rate schedules are step schedules, and ``results.json`` records the count (``budget.steps``), so the same run is
reproduced exactly on any machine with ``trainer.max_steps=<steps>`` and no seconds budget. The probe touches no random
state of the job (``isolate_rng``) and not its data order (its own loader). Step time is the median over the probe's
timed steps, each measured from batch start to batch end.
"""

from __future__ import annotations

import math
import statistics
import time

import pytorch_lightning as pl
from pytorch_lightning.utilities.seed import isolate_rng
from torch.utils.data import DataLoader


class Throughput(pl.Callback):
    """The job's own training speed: the median wall time between consecutive training-batch ends (a step as the job
    runs it: data loading, masking, forward, backward, optimizer, logging, guards), with intervals that contain a
    validation pass left out, and the median busy time (batch start to batch end). ``record(tokens_per_step)``:
    what results.json keeps under ``throughput``.

    It also keeps the validation curve: at each validation pass the step, the seconds of training so far in this
    process (from the start of fit, validation passes left out) and the ``val/*`` metrics, appended to ``log_path``
    (``val_log.jsonl`` in the job folder, readable while the job runs) and kept for results.json ``val_curve``
    (:meth:`curve`, with tokens; the evaluation after fit is its ``final`` row, :meth:`final`): the fixed-mask loss
    against steps, tokens and minutes without W&B."""

    def __init__(self, warm: int = 3, log_path=None):
        self.warm, self.intervals, self.busy = warm, [], []
        self._start = self._end = None
        self.log_path, self.rows = log_path, []
        self._t0 = self._v0 = self._t_end = None
        self._val_total = 0.0

    def on_train_start(self, trainer, module):
        self._t0, self._t_end, self._val_total = time.perf_counter(), None, 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if trainer.global_step > self.warm and self._start is not None:
            self.busy.append(now - self._start)
            if self._end is not None:
                self.intervals.append(now - self._end)
        self._end = now

    def on_validation_start(self, trainer, module):
        self._end = None  # the next interval would contain this validation pass
        self._v0 = time.perf_counter()

    def on_train_end(self, trainer, module):
        self._t_end = time.perf_counter()

    def train_seconds(self) -> float:
        """Seconds of training in this process's fit so far (to its end once it ended), validation passes left out."""
        end = self._t_end if self._t_end is not None else time.perf_counter()
        return round(end - self._t0 - self._val_total, 3)

    def on_validation_end(self, trainer, module):
        if self._t0 is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        train_s = round(self._v0 - self._t0 - self._val_total, 3)
        self._val_total += time.perf_counter() - self._v0
        self._add({"step": int(trainer.global_step), "train_s": train_s}
                  | {k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("val/")}, trainer)

    def final(self, trainer, metrics: dict) -> None:
        """The evaluation after fit (``metrics``: its ``val/*``) as the curve's last row, ``final: true``."""
        if self._t0 is not None:
            self._add({"step": int(trainer.global_step), "train_s": self.train_seconds(), "final": True}
                      | {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("val/")}, trainer)

    def _add(self, row: dict, trainer) -> None:
        self.rows.append(row)
        if self.log_path is not None and trainer.is_global_zero:
            import json

            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def curve(self, tokens_per_step: int) -> list[dict]:
        """results.json ``val_curve``: each validation pass's row with ``tokens`` (steps x tokens per step)."""
        return [{"step": r["step"], "tokens": r["step"] * tokens_per_step, **r} for r in self.rows]

    def record(self, tokens_per_step: int) -> dict:
        if not self.intervals:
            return {"steps_timed": 0}
        step = statistics.median(self.intervals)
        return {"steps_timed": len(self.intervals), "step_s_median": step,
                "busy_s_median": statistics.median(self.busy), "tokens_per_step": tokens_per_step,
                "tokens_per_s": tokens_per_step / step}


class _StepTimer(pl.Callback):
    """Seconds of each training step after ``warm`` warm-up steps (batch start to batch end, so a validation pass is
    not counted in a step), and of the validation pass."""

    def __init__(self, warm: int):
        self.warm, self.steps, self._t = warm, [], None
        self.val_s, self._v0 = None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t = time.perf_counter() if trainer.global_step >= self.warm else None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self._t is not None:
            self.steps.append(time.perf_counter() - self._t)

    def on_validation_start(self, trainer, module):
        self._v0 = time.perf_counter()

    def on_validation_end(self, trainer, module):
        self.val_s = time.perf_counter() - self._v0


def calibrate_steps(make_module, train_set, val_set, batch_size: int, val_batch_size: int, trainer_kwargs: dict,
                    seconds: float, val_check_interval: int, probe_steps: int = 12, warm: int = 3) -> dict:
    """Steps of training that fit ``seconds`` of ``trainer.fit``: steps x s_per_step + floor(steps / interval) x val_s.

    ``make_module()`` builds the probe module (called inside ``isolate_rng``, so the job's own initialisation is the
    same as without a probe). Returns the calibration record (``steps`` is what the run uses)."""
    t_start = time.perf_counter()
    with isolate_rng():
        module = make_module()
        timer = _StepTimer(warm)
        total = warm + probe_steps
        trainer = pl.Trainer(**{**trainer_kwargs, "enable_progress_bar": False}, max_steps=total, max_epochs=-1,
                             val_check_interval=total, check_val_every_n_epoch=None, logger=False,
                             enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[timer])
        import torch

        g = torch.Generator().manual_seed(0)
        train_dl = DataLoader(train_set, batch_size=batch_size, shuffle=True, drop_last=True, generator=g)
        val_dl = DataLoader(val_set, batch_size=val_batch_size, shuffle=False)
        trainer.fit(module, train_dataloaders=train_dl, val_dataloaders=val_dl)
    if not timer.steps:
        raise RuntimeError(f"the timing probe ran {trainer.global_step} steps; it needs more than {warm} "
                           "(fewer training blocks than warm-up + probe steps?)")
    # the median: a long run's mean step time; the probe's mean is pulled up by its first steps' one-off costs
    s_step = statistics.median(timer.steps)
    val_s = timer.val_s or 0.0
    per_step = s_step + val_s / max(1, val_check_interval)
    steps = max(1, math.floor(seconds / per_step))
    return {"seconds": seconds, "steps": steps, "s_per_step": s_step, "val_s": val_s, "probe_steps": len(timer.steps),
            "warmup_steps": warm, "probe_s": time.perf_counter() - t_start,
            "expected_fit_s": steps * s_step + (steps // max(1, val_check_interval)) * val_s}
