"""Reliability of a pretraining job: periodic and SIGTERM checkpoints (written atomically), exact resume (the data
order, RNG states and counters a checkpoint needs beyond Lightning's own), a guard against non-finite losses and
gradients, a per-step loss log, and a summary of the failed jobs at the end of a multirun.

Exact resume needs five things to continue where they were: the global step, optimizer and LR-scheduler state (Lightning
saves them), the mask stream and the schedule position (keyed by the global step, see ``mlmlab.lit.mlm``), the data order
(:class:`ResumableSampler`: a fixed permutation per (seed, epoch), restarted at the batch after the last one trained)
and the global RNG states that dropout draws from (saved and restored by :class:`Guard`).

Test-only fault hooks (environment variables, read at each step; never set them outside tests):
``MLMLAB_FAULT_KILL_AT_STEP=N`` SIGKILLs the job right after optimizer step N (after any checkpoint of that step),
``MLMLAB_FAULT_SIGTERM_AT_STEP=N`` sends it a SIGTERM there.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

from mlmlab.data.datamodule import ResumableSampler

log = logging.getLogger(__name__)

NONFINITE_MODES = ("error", "skip", "off")


class NonFiniteError(RuntimeError):
    """A NaN/inf loss or gradient stopped the job (``trainer.nonfinite=error``); the message names the step."""


class Preempted(SystemExit):
    """The job got SIGTERM (preemption, SLURM time limit): a checkpoint was saved, the job stops with exit code 1."""


# --------------------------------------------------------------------------------------------------- checkpoints


def atomic_save_checkpoint(trainer: pl.Trainer, path: str | Path) -> Path:
    """``trainer.save_checkpoint`` to a temporary file in the same folder, then ``os.replace``: a kill at any moment
    leaves either the previous checkpoint or the new one, never a truncated file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:6]}")
    trainer.save_checkpoint(tmp)  # all ranks call it; rank 0 writes
    if trainer.is_global_zero:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    trainer.strategy.barrier("atomic_save_checkpoint")
    return path


def resume_path(resume: str) -> Path:
    """``resume=<run dir or .ckpt file>``: a run dir means ``<dir>/checkpoints/last.ckpt``."""
    p = Path(str(resume)).expanduser()
    return p / "checkpoints" / "last.ckpt" if p.is_dir() else p


def resume_wandb_id(resume: str | None) -> str | None:
    """The W&B run id a ``resume=`` checkpoint was logged under (None without resume, W&B or a readable checkpoint):
    the resumed job continues that run."""
    if resume is None:
        return None
    try:
        ckpt = torch.load(resume_path(resume), map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # check_resume names the key when the checkpoint is unreadable
        return None
    return (ckpt.get("mlmlab") or {}).get("wandb_id") if isinstance(ckpt, dict) else None


# what may differ between a checkpoint's run and the run that resumes it (nothing of the pretraining itself)
RESUME_FREE = ("paths", "resume", "skip_completed", "logger", "downstream", "trainer.checkpoint_every_n_steps",
               "trainer.nonfinite", "trainer.enable_progress_bar", "data.num_workers", "data.num_proc",
               "eval.zeroshot_every_n_steps", "eval.zeroshot_n_per_paradigm")


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def check_resume(resume: str, config: dict) -> Path:
    """The checkpoint ``resume=`` names, after checking it is a pretraining checkpoint of this same config (ConfigError
    naming ``resume`` and the keys that differ otherwise: an exact resume cannot change the run it continues)."""
    from mlmlab.errors import ConfigError

    path = resume_path(resume)  # that it exists was checked by mlmlab.config.validate_reliability
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:
        raise ConfigError(f"resume={resume!r}: {path} could not be read as a checkpoint ({type(e).__name__}: {e})") \
            from e
    before = ((ckpt.get("mlmlab") or {}).get("config")) if isinstance(ckpt, dict) else None
    if before is None:
        raise ConfigError(f"resume={resume!r}: {path} is not an mlmlab pretraining checkpoint")
    free = lambda k: any(k == f or k.startswith(f + ".") for f in RESUME_FREE)  # noqa: E731
    a, b = _flatten(before), _flatten(config)
    changed = sorted(k for k in set(a) | set(b) if not free(k) and a.get(k) != b.get(k))
    if changed:
        raise ConfigError(f"resume={resume!r}: the checkpoint was made with a different config ("
                          + ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in changed[:8])
                          + (" ..." if len(changed) > 8 else "") + "); resume with the same overrides")
    log.info("resuming from %s (global step %s)", path, ckpt.get("global_step"))
    return path


# -------------------------------------------------------------------------------------------------------- data


# -------------------------------------------------------------------------------------------------------- guard


def _rng_state() -> dict:  # plain types and tensors only: Lightning loads checkpoints with weights_only=True
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    s = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
         "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


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
        self.after_save: list = []  # callables run after each checkpoint is on disk

    @property
    def last_ckpt(self) -> Path:
        return self.ckpt_dir / "last.ckpt"

    # ---- state carried by checkpoints
    def state_dict(self) -> dict:
        return {"skipped_nonfinite": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped_nonfinite", 0))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        extra = {"rng": _rng_state(), "time": time.time()}
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
            _set_rng_state(self._rng_to_load)
            self._rng_to_load = None
        if self.log_path is not None and self.log_path.exists() and trainer.is_global_zero:
            keep = [ln for ln in self.log_path.read_text().splitlines()
                    if ln.strip() and json.loads(ln)["step"] <= trainer.global_step]
            self.log_path.write_text("".join(ln + "\n" for ln in keep))

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
        _fault_hooks(step, "MLMLAB_FAULT_SIGTERM_AT_STEP")  # as if it arrived during this step
        # set by Lightning's SIGTERM handler. Under DDP the signal may reach one rank only: act on it there would
        # deadlock the others in the checkpoint's barrier, so leave it to Lightning, which broadcasts it at the next
        # batch and raises SIGTERMException on every rank together (then on_exception saves, on every rank)
        sigterm = bool(getattr(trainer, "received_sigterm", False)) and trainer.world_size == 1
        if (self.every and step % self.every == 0) or sigterm:
            self._save(trainer, "SIGTERM" if sigterm else "")
        if sigterm:
            raise self.preempted(step)
        _fault_hooks(step, "MLMLAB_FAULT_KILL_AT_STEP")  # after the checkpoint of this step

    def _save(self, trainer, why: str = "") -> None:
        self.last_good = atomic_save_checkpoint(trainer, self.last_ckpt)
        self._saved_step = trainer.global_step
        log.info("checkpoint: step %d -> %s%s", trainer.global_step, self.last_good, f" ({why})" if why else "")
        for hook in self.after_save:  # e.g. wait for the logger's log to reach the disk
            hook()

    def preempted(self, step: int) -> Preempted:
        return Preempted(f"SIGTERM at step {step}: checkpoint saved to {self.last_ckpt}; continue with "
                         f"resume={self.ckpt_dir.parent}")

    def on_exception(self, trainer, pl_module, exception) -> None:
        """Lightning's own SIGTERM exit (at an epoch's end or during validation, where the signal can also land):
        checkpoint first, unless this step is saved already. train.py turns it into :class:`Preempted`."""
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException) and self._saved_step != trainer.global_step:
            self._save(trainer, "SIGTERM")


def _fault_hooks(step: int, var: str) -> None:
    """Test-only fault injection (see the module docstring)."""
    sig = signal.SIGKILL if var == "MLMLAB_FAULT_KILL_AT_STEP" else signal.SIGTERM
    at = os.environ.get(var)
    if at and int(at) == step:
        log.warning("%s=%s: sending %s to myself", var, at, sig.name)
        os.kill(os.getpid(), sig)
        time.sleep(0.1)  # let the handler run before going on


# ------------------------------------------------------------------------------------------------ sweep summary


class SweepSummary:
    """Hydra callback (``hydra.callbacks`` in conf/train.yaml): at the end of a multirun -- also when a failed job
    makes Hydra exit with an error -- log which jobs failed and why (from their results.json) and write
    ``<sweep dir>/summary.json``. Jobs keep running after one fails (Hydra raises the first failure only after the
    whole batch has run)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        import atexit

        sweep_dir = Path(str(config.hydra.sweep.dir))
        atexit.register(summarize_sweep, sweep_dir)

    # hydra.experimental.callback.Callback's other hooks, as no-ops (duck-typed: Hydra calls what exists)
    def on_run_start(self, config, **kwargs) -> None: ...
    def on_run_end(self, config, **kwargs) -> None: ...
    def on_multirun_end(self, config, **kwargs) -> None: ...
    def on_job_start(self, config, **kwargs) -> None: ...
    def on_job_end(self, config, job_return, **kwargs) -> None: ...
    def on_compose_config(self, config, config_name, overrides) -> None: ...


def summarize_sweep(sweep_dir: Path) -> dict | None:
    """Count the jobs of a sweep dir by status (from each job's results.json), log the failed ones with their error,
    and write ``summary.json``. Returns the summary (None when the dir holds no job)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return None
    jobs = []
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        path = job / "results.json"
        if not path.exists():
            if (job / ".hydra").exists():
                jobs.append({"dir": job.name, "status": "missing", "error": "no results.json (killed?)"})
            continue
        try:
            r = json.loads(path.read_text())
        except ValueError as e:
            jobs.append({"dir": job.name, "status": "unreadable", "error": str(e)})
            continue
        err = r.get("error") or {}
        jobs.append({"dir": job.name, "status": r.get("status"),
                     "error": f"{err.get('type')}: {err.get('message')}" if err else None})
    if not jobs:
        return None
    bad = [j for j in jobs if j["status"] != "ok"]
    summary = {"jobs": len(jobs), "ok": len(jobs) - len(bad), "failed": bad}
    tmp = sweep_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, sweep_dir / "summary.json")
    lines = [f"multirun summary: {summary['ok']} of {len(jobs)} jobs ok, {len(bad)} failed ({sweep_dir})"]
    lines += [f"  FAILED {j['dir']}: {j['status']}: {(j['error'] or '')[:300]}" for j in bad]
    msg = "\n".join(lines)
    log.warning(msg) if bad else log.info(msg)
    if not _logs_to_console(log):  # at interpreter exit the logging handlers may be gone: then print it, once
        print(msg, flush=True)
    return summary


def _logs_to_console(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` reaches a stream handler that is not a file (the terminal)."""
    lg: logging.Logger | None = logger
    while lg is not None:
        if any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in lg.handlers):
            return True
        lg = lg.parent if lg.propagate else None
    return False
