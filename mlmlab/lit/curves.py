"""Evaluation curves over pretraining (``eval.zeroshot_every_n_steps``): every N optimizer steps (and once before the
first), the cheap, seed-free read-outs of the job's downstream tasks -- zero-shot minimal pairs (BLiMP subsample) and
the linear probe of each classification task -- logged to W&B at that step (``curve/<task>/acc``,
``curve/probe/<task>/<metric>``) and kept for results.json (``curves``). When does a masking strategy leave the
unigram plateau, and when do its features start to carry the task?"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytorch_lightning as pl
from pytorch_lightning.utilities.seed import isolate_rng

log = logging.getLogger(__name__)


class EvalCurve(pl.Callback):
    """``evaluate(pl_module) -> {key: value}`` at step 0 and every ``every`` optimizer steps (rank 0; the training
    RNG streams are left untouched)."""

    def __init__(self, every: int, evaluate: Callable[[pl.LightningModule], dict[str, float]]):
        self.every, self.evaluate = every, evaluate
        self.rows: list[dict] = []
        self._done: set[int] = set()

    def _run(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if step in self._done or not trainer.is_global_zero:
            return
        self._done.add(step)
        t0 = time.perf_counter()
        with isolate_rng():
            metrics = self.evaluate(pl_module)
        row = {"step": step, **metrics, "seconds": round(time.perf_counter() - t0, 3)}
        self.rows.append(row)
        log.info("curve at step %d: %s", step, {k: round(v, 4) for k, v in row.items() if k != "step"})
        if trainer.logger:
            trainer.logger.log_metrics({**metrics, "curve/seconds": row["seconds"]}, step=step)

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:
            self._run(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step > 0 and trainer.global_step % self.every == 0:
            self._run(trainer, pl_module)
