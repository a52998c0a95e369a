"""The frame of every job -- pretraining (``mlmlab.train``) and fine-tuning a checkpoint (``mlmlab.finetune``): what
Hydra knows about the job, its threads, its ``results.json`` (ok or failed, written before W&B is finished), its W&B
runs, ``skip_completed`` and one-line config errors. Neither entry point imports the other; both use this."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from mlmlab.config import ConfigError, to_container
from mlmlab.sweep import JOB_LOCK, clear_running, global_rank, lock_folder, mark_running, unlock_folder

log = logging.getLogger(__name__)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def hydra_info() -> dict:
    """What Hydra knows about this job (empty outside Hydra, e.g. when a test calls ``train`` directly)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    n_jobs = hc.launcher.get("n_jobs") if multirun else None  # the joblib launcher: jobs at once (-1: one per core)
    return {"overrides": list(hc.overrides.task), "override_dirname": hc.job.override_dirname, "multirun": multirun,
            "sweep_dir": hc.sweep.dir if multirun else None, "job_num": hc.job.num if multirun else None,
            "parallel_jobs": (os.cpu_count() if n_jobs == -1 else n_jobs) if isinstance(n_jobs, int) else None}


def wandb_group(w, info: dict) -> str:
    """The W&B group of a job: ``logger.wandb.group`` (``w``), else the sweep dir's name in a multirun, else single."""
    return (w.group if w is not None and w.group else
            "sweep_" + str(info["sweep_dir"]).strip("/").replace("/", "_") if info.get("multirun") else "single")


def start_wandb(w, config: dict, info: dict, out_dir: Path, job_type: str = "pretrain",
                group: str | None = None, name_prefix: str = "", run_id: str | None = None):
    """The job's W&B run, as ``logger.wandb`` (``w``; None or mode=disabled: none) says. ``run_id``: a resumed job continues the W&B run of the checkpoint it resumes -- online with
    ``resume="allow"``; offline W&B cannot resume (it warns and ignores it), so the resumed job writes a second offline
    log under the same id, which ``wandb sync`` uploads into the same run and mlmlab.analysis reads as one history."""
    if w is None or w.mode == "disabled":
        return None
    import wandb

    group = group or wandb_group(w, info)
    name = name_prefix + (w.name or info.get("override_dirname") or "default")
    resume = {"id": run_id, **({"resume": "allow"} if w.mode == "online" else {})} if run_id else {}
    return wandb.init(project=w.project, entity=w.entity, mode=w.mode, group=group, job_type=job_type, name=name,
                      tags=list(w.tags), config=config, dir=str(out_dir), reinit="create_new", **resume,
                      settings=wandb.Settings(console="off", x_disable_stats=True,
                                              x_transaction_log_flush_interval=float(w.flush_seconds)))


def wandb_barrier(run, flush_seconds: float) -> None:
    """Return once what the job logged to W&B so far is in the run's ``.wandb`` file on disk: reading the summary is a
    round trip to the W&B service (which handles records in order, so every earlier history row has been handled),
    then one flush interval of the service's log writer passes."""
    try:
        list(run.summary.keys())
    except Exception as e:  # never fail a checkpoint over W&B
        log.debug("W&B summary round trip failed (%s: %s)", type(e).__name__, e)
    time.sleep(flush_seconds + 0.1)


def finish_wandb(run, exit_code: int) -> None:
    """Finish the job's W&B run and wait until its files are complete on disk. ``run.finish()`` only informs the W&B
    service, which closes (and flushes) the run's ``.wandb`` log asynchronously, so a reader right after the job could
    find it truncated; tearing the service down (when no other run is active in this process) waits for that."""
    import wandb

    run.finish(exit_code=exit_code)
    wl = getattr(run, "_wl", None)
    if getattr(wl, "most_recent_active_run", None) is None:  # a property: the newest unfinished run
        wandb.teardown()


def finetune_runs(w, wandb_runs: bool, config: dict, info: dict, out_dir: Path, group: str | None, parent: str,
                  prefix: str = ""):
    """``downstream.wandb_runs=true`` (``wandb_runs``) and W&B on (``logger.wandb``, ``w``): a factory of one W&B run
    per fine-tuning (task, lr, seed), else None."""
    if not wandb_runs or w is None or w.mode == "disabled":
        return None

    def make(task: str, lr: float, seed: int):
        c = {**config, "finetune_run": {"task": task, "lr": lr, "seed": seed, "parent": parent}}
        try:
            return start_wandb(w, c, info, out_dir, job_type="finetune", group=group,
                               name_prefix=f"{prefix}{task}:lr{lr:g}:seed{seed}:")
        except Exception as e:  # W&B is never the only copy: the fine-tuning goes on without its run
            log.error("W&B run for %s lr=%g seed=%d failed to start (%s: %s); continuing without it", task, lr, seed,
                      type(e).__name__, e)
            return None

    return make


def trainer_kwargs(t) -> dict:
    """The Lightning Trainer's arguments every job shares, from ``trainer.*`` (``t``): the precision as it will run."""
    from mlmlab.hardware import resolve_precision

    return {"accelerator": t.accelerator, "precision": resolve_precision(t.precision, t.accelerator),
            "deterministic": t.deterministic,
            "enable_progress_bar": t.enable_progress_bar}


def _declared_skipped(downstream, q) -> dict | None:
    """What a job of the groups ``downstream`` and ``analysis`` (``q``) leaves out of fine-tuning (results.json
    ``downstream.skipped`` as it will write it: :meth:`mlmlab.config.DownstreamConfig.declared`), None where nothing
    or where the config has no question."""
    import json

    from omegaconf import OmegaConf

    if q is None or downstream is None:
        return None
    try:
        ds = OmegaConf.to_object(downstream)
        skipped = ds.declared(q.get("primary"), list(q.get("family") or [])).skipped
    except (ValueError, AttributeError):  # a bad value (the job's validation names it) or an untyped node
        return None
    return json.loads(json.dumps(skipped)) if skipped else None


def completed_metrics(cfg: DictConfig) -> dict[str, float] | None:
    """The metrics of ``<paths.output_dir>/results.json`` if it is a finished run of this same config, else None."""
    import json

    path = Path(cfg.paths.output_dir).expanduser() / "results.json"
    if not path.exists():
        return None
    try:
        r = json.loads(path.read_text())
        now = to_container(cfg)
    except Exception as e:  # a truncated record (results.json is written atomically, so only by hand) or a bad config
        log.warning("skip_completed: %s is not readable (%s); running the job", path, e)
        return None
    if r.get("status") != "ok" or "downstream/score" not in (r.get("metrics") or {}):
        log.info("skip_completed: %s is %s; running the job again", path, r.get("status"))
        return None
    from mlmlab.checkpoint import COMPLETED_FREE, config_diff

    # downstream.only_declared: a record that fine-tuned every budget (from before the key, or with it false) holds
    # what a lean job runs; a lean record, only if this config's question leaves out the same (results.json
    # downstream.skipped)
    changed = [c for c in config_diff(r.get("config"), now, COMPLETED_FREE)
               if not (c[0] == "downstream.only_declared" and c[1] in (None, False) and c[2] is True)]
    before, after = (r.get("downstream") or {}).get("skipped"), _declared_skipped(cfg.get("downstream"), cfg.get("analysis"))
    if before is not None and before != after:
        log.warning("skip_completed: %s left out %s; this config's question (analysis.*) asks for %s; running the job "
                    "again", path, before, after or "everything")
        return None
    if changed:
        log.warning("skip_completed: %s was run with a different config (%s differ); running the job again", path,
                    ", ".join(k for k, _, _ in changed))
        return None
    log.info("skip_completed: %s is complete; not running this job again", path)
    return {k: float("nan") if v is None else v for k, v in r["metrics"].items()}  # null: missing (NaN), as written


class Job:
    """The frame of every job (pretraining, fine-tuning a checkpoint), as a context manager::

        with Job(cfg, validate) as job:      # check(cfg) before any work; a bad config: failed record, ConfigError
            metrics = ...                     # job.config, job.info, job.out_dir, job.record; job.run = the W&B run
            return job.done(metrics)          # results.json ok, written before W&B is finished

    Leaving the block with an exception writes a failed ``results.json`` (the error and whatever was recorded) and
    re-raises; W&B is finished whatever happens, and a W&B failure never fails a finished job."""

    def __init__(self, cfg: DictConfig, check):
        from mlmlab.results import RunRecord

        self.cfg, self.check = cfg, check
        self.info = hydra_info()
        self.out_dir = Path(cfg.paths.output_dir).expanduser()
        from mlmlab.lit import quiet_library_noise

        quiet_library_noise()
        set_job_threads(cfg, self.info)  # before the record notes torch's threads
        self.record = RunRecord(self.out_dir, _safe_container(cfg), self.info.get("overrides"))
        self.rank = global_rank()
        if self.rank:  # results.json and the running marker are rank 0's; another rank's outcome is kept beside them
            self.record.filename = f"results.rank{self.rank}.json"
        self.config: dict = {}
        self.run = None  # the W&B run, once the job has started it
        self.ok = False
        self.locked = False  # whether this Job took its folder's lock (released when it ends)

    def __enter__(self) -> Job:
        if self.rank == 0:  # first of all: another live job in this folder is refused before anything is written
            self.locked = lock_folder(self.out_dir, JOB_LOCK, "job")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.rank == 0:  # first: a sweep's summary tells this running job (even while checking) from a killed one
                mark_running(self.out_dir)
            self.check(self.cfg)  # fail fast: nothing below runs on a bad config
            self.config = to_container(self.cfg)
            self.record.set(config=self.config)
        except BaseException as e:
            self._failed(e)
            if self.rank == 0:
                clear_running(self.out_dir)
            self._unlock()
            raise
        return self

    def _unlock(self) -> None:
        if self.locked:
            unlock_folder(self.out_dir, JOB_LOCK)
            self.locked = False

    def done(self, metrics: dict[str, float]) -> dict[str, float]:
        self.record.set(status="ok", metrics=metrics)
        self.record.write()  # before W&B is finished: the local record never depends on W&B
        self.ok = True
        return metrics

    def _failed(self, e: BaseException) -> None:
        self.record.fail(e)
        path = self.record.write()
        log.error("job failed (%s: %s); record written to %s", type(e).__name__, e, path)

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is not None:
                self._failed(exc)
        finally:
            if self.rank == 0:
                clear_running(self.out_dir)
            try:
                self._finish_wandb()
            finally:
                self._unlock()
        return False

    def _finish_wandb(self) -> None:
        if self.run is None:
            return
        try:
            if self.ok:
                self.run.summary.update({k: v for k, v in self.record.data["metrics"].items()})
                self.run.summary.update({f"timings/{k}": v for k, v in self.record.data["timings_s"].items()})
        except Exception as e:  # results.json is already written: a W&B failure must not fail a finished job
            log.error("W&B summary failed (%s: %s); results.json has the record", type(e).__name__, e)
        finally:
            try:
                finish_wandb(self.run, 0 if self.ok else 1)
            except Exception as e:
                log.error("W&B finish failed (%s: %s); results.json has the record", type(e).__name__, e)


def set_job_threads(cfg: DictConfig, info: dict) -> None:
    """``trainer.threads`` (mlmlab.hardware.job_threads)."""
    from mlmlab.config import valid_threads
    from mlmlab.hardware import apply_threads, job_threads

    setting = cfg.trainer.get("threads", "auto") if "trainer" in cfg else "auto"
    if valid_threads(setting):  # a bad value fails in the job's check(cfg)
        threads, warning = job_threads(setting, info.get("parallel_jobs"))
        if warning:
            log.warning("trainer.threads=%s: %s", setting, warning)
        if threads is not None:
            apply_threads(threads)


def _safe_container(cfg: DictConfig) -> dict:
    try:
        return to_container(cfg)
    except Exception:  # an unresolvable interpolation must not hide the real error
        return OmegaConf.to_container(cfg, resolve=False)


class OneLineConfigError(ConfigError, CompactHydraException):
    """A job's ConfigError leaving a multirun: Hydra prints a CompactHydraException as its message, without a traceback."""


def config_errors_in_one_line(fn):
    """A single run's ``ConfigError`` as one line on stderr (and the failed record's path) with exit code 2, instead of
    Hydra's traceback; ``HYDRA_FULL_ERROR=1`` keeps the traceback. In a multirun the error is raised as before, so the
    launcher records that job as failed and goes on with the others, and Hydra prints the error as one line (no
    traceback) when the sweep ends."""
    import functools
    import sys

    @functools.wraps(fn)
    def wrapper(cfg):
        try:
            return fn(cfg)
        except ConfigError as e:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            if multirun:  # the launcher records the job as failed; Hydra prints this class as its message alone
                raise OneLineConfigError(str(e)) from None
            record = Path(cfg.paths.output_dir).expanduser() / "results.json"
            where = f" (record: {record})" if record.exists() else ""
            print(f"error: {e}{where}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper
