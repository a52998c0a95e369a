"""The training guard of a pretraining job: periodic and SIGTERM checkpoints (written atomically by
``mlmlab.checkpoint``), the RNG states and data position a checkpoint carries for exact resume, a guard against
non-finite losses and gradients, and a per-step loss log. Checkpoints and resume: ``mlmlab.checkpoint``; the end
of a multirun: ``mlmlab.sweep``; the test-only fault injection around the guard: ``mlmlab.lit.faults``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

from mlmlab.checkpoint import atomic_save_checkpoint, rng_state, set_rng_state
from mlmlab.data.datamodule import ResumableSampler

log = logging.getLogger(__name__)

NONFINITE_MODES = ("error", "skip", "off")


class NonFiniteError(RuntimeError):
    """A NaN/inf loss or gradient stopped the job (``trainer.nonfinite=error``); the message names the step."""


class Preempted(SystemExit):
    """The job got SIGTERM (preemption, SLURM time limit): a checkpoint was saved, the job stops with exit code 1."""


# -------------------------------------------------------------------------------------------------------- guard


class Guard(pl.Callback):
    """One callback for the reliability of ``trainer.fit``:

    - ``every_n_steps``: ``<ckpt_dir>/last.ckpt`` after every n-th optimizer step (atomic); on SIGTERM a checkpoint
      at the end of the current step, then :class:`Preempted`.
    - ``nonfinite``: ``error`` raises :class:`NonFiniteError` (step named; the last periodic checkpoint is kept,
      nothing is saved after a bad step), ``skip`` drops the step's gradients (the optimizer leaves every parameter
      and its moments unchanged) and counts it, ``off`` checks nothing (no host sync per step).
    - checkpoints carry the sampler position, the global RNG states and the skip count (:meth:`state_dict`), so a
      resumed fit draws the same batches and dropout masks as an uninterrupted one.
    - ``log_path``: one JSON line ``{"step", "loss"}`` every ``log_every`` steps (a loss curve that does not depend
      on W&B; on resume the lines past the resumed step are dropped).
    """

    def __init__(self, ckpt_dir: Path, every_n_steps: int | None = None, nonfinite: str = "error",
                 sampler: ResumableSampler | None = None, log_path: Path | None = None, log_every: int = 1):
        self.ckpt_dir, self.every = Path(ckpt_dir), every_n_steps
        self.nonfinite, self.sampler = nonfinite, sampler
        self.log_path, self.log_every = log_path, max(1, log_every)
        self.skipped = 0
        self.last_good: Path | None = None
        self._losses: list[torch.Tensor] = []
        self._batches_done = 0  # batches trained from the sampler's current iteration (epoch)
        self._iteration = None
        self._prev_step = 0
        self._saved_step = -1
        self._rng_to_load: dict | None = None
        self.after_save: list = []  # callables run once a checkpoint and its step's logged row are out (next batch)
        self._after_save_due = False

    @property
    def last_ckpt(self) -> Path:
        return self.ckpt_dir / "last.ckpt"

    # ---- state carried by checkpoints
    def state_dict(self) -> dict:
        return {"skipped_nonfinite": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped_nonfinite", 0))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        extra = {"rng": rng_state(), "time": time.time()}
        if self.sampler is not None:
            extra["sampler"] = self.sampler.state_dict(self._batches_done)
        checkpoint["mlmlab_resume"] = extra

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        extra = checkpoint.get("mlmlab_resume") or {}
        if self.sampler is not None and "sampler" in extra:
            self.sampler.load_state_dict(extra["sampler"])
        self._rng_to_load = extra.get("rng")

    # ---- training hooks
    def on_train_start(self, trainer, pl_module) -> None:
        self._prev_step = trainer.global_step
        if self._rng_to_load is not None:  # last: nothing between here and the first batch draws from them
            set_rng_state(self._rng_to_load)
            self._rng_to_load = None
        if self.log_path is not None and self.log_path.exists() and trainer.is_global_zero:
            keep = [ln for ln in self.log_path.read_text().splitlines()
                    if ln.strip() and json.loads(ln)["step"] <= trainer.global_step]
            self.log_path.write_text("".join(ln + "\n" for ln in keep))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._after_save_due:  # e.g. wait for the W&B log to reach the disk (mlmlab.job.wandb_barrier)
            self._after_save_due = False
            for hook in self.after_save:
                hook()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self.nonfinite != "off":
            self._losses.append(loss.detach())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.nonfinite == "off":
            return
        losses, self._losses = self._losses, []
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        loss_ok = torch.isfinite(torch.stack(losses)).all() if losses else None
        check_grads = grads and "16-mixed" not in str(trainer.precision)  # fp16: the grad scaler skips inf steps
        grad_ok = torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()) if check_grads else None
        flags = [f for f in (loss_ok, grad_ok) if f is not None]
        if not flags or bool(torch.stack(flags).all()):  # one host sync per optimizer step
            return
        step = trainer.global_step + 1  # the step this optimizer update would complete (1-based, like global_step)
        what = "loss" if loss_ok is not None and not bool(loss_ok) else "gradient"
        values = ", ".join(f"{float(x):g}" for x in losses[:4])
        if self.nonfinite == "skip":
            for g in optimizer.param_groups:
                for p in g["params"]:
                    p.grad = None
            self.skipped += 1
            log.warning("non-finite %s at step %d (loss %s): batch skipped (%d so far)", what, step, values,
                        self.skipped)
            return
        kept = (f"the last good checkpoint is {self.last_good} (resume={self.last_good})" if self.last_good
                else "no checkpoint was saved before it (trainer.checkpoint_every_n_steps)")
        raise NonFiniteError(f"non-finite {what} at step {step} (loss {values}); training stopped, {kept}; "
                             "trainer.nonfinite=skip skips such batches instead")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.sampler is not None and self.sampler.current != self._iteration:  # a new epoch's iteration began
            self._iteration, self._batches_done = self.sampler.current, 0
        self._batches_done += 1
        step = trainer.global_step
        if step == self._prev_step:  # inside a gradient accumulation: no optimizer step yet
            return
        self._prev_step = step
        if self.log_path is not None and trainer.is_global_zero and step % self.log_every == 0:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")
        # set by Lightning's SIGTERM handler. Under DDP the signal may reach one rank only: act on it there would
        # deadlock the others in the checkpoint's barrier, so leave it to Lightning, which broadcasts it at the next
        # batch and raises SIGTERMException on every rank together (then on_exception saves, on every rank)
        sigterm = bool(getattr(trainer, "received_sigterm", False)) and trainer.world_size == 1
        if (self.every and step % self.every == 0) or sigterm:
            self._save(trainer, "SIGTERM" if sigterm else "")
        if sigterm:
            raise self.preempted(step)

    def _save(self, trainer, why: str = "") -> None:
        self.last_good = atomic_save_checkpoint(trainer, self.last_ckpt)
        self._saved_step = trainer.global_step
        log.info("checkpoint: step %d -> %s%s", trainer.global_step, self.last_good, f" ({why})" if why else "")
        self._after_save_due = bool(self.after_save)  # run at the next batch's start: Lightning sends the saved
        # step's own logged row to the loggers after the callbacks' on_train_batch_end, i.e. after this save

    def preempted(self, step: int) -> Preempted:
        return Preempted(f"SIGTERM at step {step}: checkpoint saved to {self.last_ckpt}; continue with "
                         f"resume={self.ckpt_dir.parent}")

    def on_exception(self, trainer, pl_module, exception) -> None:
        """Lightning's own SIGTERM exit (at an epoch's end or during validation, where the signal can also land):
        checkpoint first, unless this step is saved already. train.py turns it into :class:`Preempted`."""
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException) and self._saved_step != trainer.global_step:
            self._save(trainer, "SIGTERM")
