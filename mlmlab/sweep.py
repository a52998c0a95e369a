"""The end of a multirun: which jobs failed and why (``hydra.callbacks`` in conf/train.yaml)."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from mlmlab.locks import JOB_LOCK, SWEEP_LOCK, FolderBusy, lock_folder, lock_sweep, unlock_folder  # noqa: F401
from mlmlab.results import dumps

log = logging.getLogger(__name__)


class SweepSummary:
    """Hydra callback (``hydra.callbacks`` in conf/train.yaml): at the end of a multirun -- also when a failed job
    makes Hydra exit with an error -- log which jobs failed and why (from their results.json) and write
    ``<sweep dir>/summary.json``. Jobs keep running after one fails (Hydra raises the first failure only after the
    whole batch has run)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        import atexit

        try:
            validate_grid(config)  # every job of the grid, before the first one runs
        except Exception as e:  # Hydra turns a callback's exception into a warning and runs the jobs: exit instead
            import sys

            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        sweep_dir = Path(str(config.hydra.sweep.dir))
        lock_sweep(sweep_dir)  # one multirun per sweep dir, before any job
        atexit.register(summarize_sweep, sweep_dir)

    # hydra.experimental.callback.Callback's other hooks, as no-ops (duck-typed: Hydra calls what exists)
    def on_run_start(self, config, **kwargs) -> None: ...
    def on_run_end(self, config, **kwargs) -> None: ...
    def on_multirun_end(self, config, **kwargs) -> None: ...
    def on_job_start(self, config, **kwargs) -> None: ...
    def on_job_end(self, config, job_return, **kwargs) -> None: ...
    def on_compose_config(self, config, config_name, overrides) -> None: ...


def grid(config) -> list[list[str]]:
    """The override lists of a multirun's jobs, as Hydra's basic sweeper (and mlmlab's, which extends it) expands them:
    the command line's overrides and a ``+sweep=`` file's ``hydra.sweeper.params``; for a sweep that declares
    ``analysis.sequential``, every job its rounds may run (:mod:`mlmlab.rounds`). Empty for another sweeper (e.g.
    Optuna, whose trials are drawn as it runs)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    from hydra_plugins.mlmlab_sweeper.mlmlab_sweeper import grid_overrides, sequential_plan

    sweeper = str(config.hydra.sweeper.get("_target_", ""))
    if not sweeper.endswith(("BasicSweeper", "MlmlabSweeper")):
        return []
    task = list(config.hydra.overrides.task)
    p = sequential_plan(config, task) if sweeper.endswith("MlmlabSweeper") else None
    if p is not None:
        return [list(j.overrides) for j in p.all_jobs()]
    return [job for batch in BasicSweeper.split_arguments(grid_overrides(config, task), None) for job in batch]


def check_start(cfg, overrides: list[str], loader, seen: set) -> None:
    """A job's ``init.*`` as its job will check it, before any job of the grid runs: ``init.checkpoint`` read (once per
    process) and its shape and tokenizer set against the job's overrides (a ``model.*`` arm that contradicts the start
    is refused here, not after other arms trained); ``init.pretrain``'s own job composed and validated once per
    distinct override list (a bad override is refused here, not in every arm's child)."""
    from hydra.types import RunMode
    from omegaconf import open_dict

    from mlmlab import init as init_
    from mlmlab.config import ConfigError, validate

    init = cfg.get("init")
    if not init_.is_set(init):
        return
    init_.check(init)
    if init.checkpoint is not None:
        start = init_.resolve(init, cfg.paths.cache_dir, cfg.paths.get("data_dir"))
        init_.adopt(cfg.model, cfg.tokenizer, start, overrides)
        return
    key = tuple(init.pretrain)
    if key in seen:
        return
    seen.add(key)
    try:
        start_cfg = loader.load_configuration("train", list(key), RunMode.RUN)
    except Exception as e:  # Hydra's composition errors (an unknown key, a bad value's grammar)
        raise ConfigError(f"init.pretrain={list(key)}: the start's job cannot be composed: "
                          f"{str(e).splitlines()[0]}") from None
    with open_dict(start_cfg):
        start_cfg.pop("hydra", None)
    try:
        validate(start_cfg)
    except ConfigError as e:
        raise ConfigError(f"init.pretrain={list(key)}: the start's job is invalid: {e}") from None


def validate_grid(config) -> None:
    """Compose and validate every job of a pretraining multirun before any runs (mlmlab.config.validate: the job's own
    checks, files included); a bad arm is a ConfigError naming its overrides, and nothing has run or been written.
    A ``mlmlab.finetune`` grid is not checked here (its validation reads the checkpoint): each of its jobs validates as
    it starts."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from mlmlab.config import ConfigError, validate

    if str(config.hydra.job.config_name) != "train":  # mlmlab.finetune grids: each job validates as it starts
        return
    jobs = grid(config)
    loader = GlobalHydra.instance().config_loader()
    starts: set = set()
    bad: list[tuple] = []
    for job in jobs:
        try:
            cfg = loader.load_sweep_config(config, list(job))  # as Hydra composes the job (its search path too)
            with open_dict(cfg):
                cfg.pop("hydra", None)
            check_start(cfg, list(job), loader, starts)
            validate(cfg)
        except ConfigError as e:
            bad.append((job, str(e)))
    if bad:  # every distinct error, each with the first job it came from and how many more share it
        by: dict[str, list] = {}
        for job, err in bad:
            by.setdefault(err, []).append(job)
        parts = [f"sweep job [{' '.join(js[0])}]{f' and {len(js) - 1} more' if len(js) > 1 else ''}: {err}"
                 for err, js in by.items()]
        raise ConfigError(f"{'; '.join(parts)} (no job of the {len(jobs)} has run)")
    if jobs:
        log.info("validated the %d jobs of the sweep before running any", len(jobs))


def summarize_sweep(sweep_dir: Path) -> dict | None:
    """Count the jobs of a sweep dir by status (from each job's results.json), log the failed ones with their error,
    and write ``summary.json``. Returns the summary (None when the dir holds no job)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return None
    jobs, warnings = [], []
    now = _fs_now(sweep_dir)  # the shared filesystem's clock: other hosts' heartbeats are its mtimes
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        entry = _job_state(job, now)
        if entry is None:
            continue
        ranks = _rank_failures(job)  # DDP: a rank > 0 that failed, beside rank 0's outcome (or its killed marker)
        if ranks and entry["status"] == "ok":  # rank 0's record holds the metrics: ok, with the ranks as a warning
            warnings.append({"dir": job.name, "error": "; ".join(ranks)})
        elif ranks and entry["status"] != "running":
            entry["error"] = "; ".join([entry["error"]] + ranks if entry["error"] else ranks)
        jobs.append({"dir": job.name, **entry})
    if not jobs:
        return None
    running = [j for j in jobs if j["status"] == "running"]
    bad = [j for j in jobs if j["status"] not in ("ok", "running")]
    summary = {"jobs": len(jobs), "ok": len(jobs) - len(bad) - len(running), "failed": bad, "running": running,
               "warnings": warnings}
    try:  # a sequential sweep (mlmlab.rounds): its rounds and each arm's decision
        summary["sequential"] = json.loads((sweep_dir / "sequential.json").read_text())
    except (OSError, ValueError):
        pass
    tmp = sweep_dir / ".summary.json.tmp"
    tmp.write_text(dumps(summary, indent=2))  # strict JSON: NaN as null
    os.replace(tmp, sweep_dir / "summary.json")
    still = f", {len(running)} still running" if running else ""
    lines = [f"multirun summary: {summary['ok']} of {len(jobs)} jobs ok, {len(bad)} failed{still} ({sweep_dir})"]
    lines += [f"  FAILED {j['dir']}: {j['status']}: {(j['error'] or '')[:300]}" for j in bad]
    lines += [f"  RUNNING {j['dir']}: {j['error']}" for j in running]
    lines += [f"  WARNING {w['dir']}: ok on rank 0, but {w['error'][:300]}" for w in warnings]
    msg = "\n".join(lines)
    log.warning(msg) if bad or warnings else log.info(msg)
    if not _logs_to_console(log):  # at interpreter exit the logging handlers may be gone: then print it, once
        print(msg, flush=True)
    return summary


def _fs_now(folder: Path) -> float:
    """The current time as the filesystem holding ``folder`` stamps it (a file server's clock on NFS), so a heartbeat
    written by another host is aged without the skew between this host's clock and the server's."""
    import time

    probe = Path(folder) / f".clock.{os.getpid()}.tmp"
    try:
        probe.touch()
        try:
            return probe.stat().st_mtime
        finally:
            probe.unlink(missing_ok=True)
    except OSError:
        return time.time()


def _job_state(job: Path, now: float | None = None) -> dict | None:
    """One job dir's status and error (None when it is not a job dir)."""
    path = job / "results.json"
    if not path.exists():
        if (job / ".hydra").exists() or (job / RUNNING).exists() or _rank_records(job):
            return unfinished_state(job, now)
        return None
    state = running_state(job, now)  # rerun in its dir (skip_completed, resume=): the record is an earlier attempt's
    if state is not None:
        return state
    try:
        r = _read_record(path)
    except ValueError as e:
        return {"status": "unreadable", "error": str(e)}
    return {"status": r.get("status"), "error": _error_text(r)}


def _read_record(path: Path) -> dict:
    """A results record (a JSON object); ValueError when it is not JSON or not an object, OSError when unreadable."""
    r = json.loads(path.read_text())
    if not isinstance(r, dict):
        raise ValueError(f"a JSON {type(r).__name__}, not an object")
    return r


def _error_text(r: dict) -> str | None:
    """``<type>: <message>`` of a record's error, None when it has none."""
    err = r.get("error") or {}
    return f"{err.get('type')}: {err.get('message')}" if err else None


def _rank_records(job: Path) -> list[tuple[int, Path]]:
    """The ``results.rank<N>.json`` records of a job dir (DDP ranks > 0), by rank."""
    found = (re.fullmatch(r"results\.rank(\d+)\.json", p.name) for p in job.iterdir())
    return sorted((int(m.group(1)), job / m.group(0)) for m in found if m)


def _attempt_start(job: Path) -> float | None:
    """When the job dir's latest attempt started (its marker's, else its record's ``started_at``): older rank records
    are an earlier attempt's."""
    import datetime

    for path, read in ((job / RUNNING, lambda m: float(m["started"])),
                       (job / "results.json",
                        lambda r: datetime.datetime.strptime(r["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp())):
        try:
            return read(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _rank_failures(job: Path) -> list[str]:
    """``rank N failed: <type>: <message>`` for each ``results.rank<N>.json`` (a DDP rank > 0) of the job's latest
    attempt that is not ok."""
    out = []
    start = _attempt_start(job)
    for rank, path in _rank_records(job):
        try:
            if start is not None and path.stat().st_mtime < start:
                continue
            r = _read_record(path)
        except (OSError, ValueError) as e:
            out.append(f"rank {rank}: unreadable record ({e})")
            continue
        if r.get("status") != "ok":
            why = _error_text(r)
            out.append(f"rank {rank} {r.get('status')}" + (f": {why}" if why else ""))
    return out


def _logs_to_console(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` reaches a stream handler that is not a file (the terminal)."""
    lg: logging.Logger | None = logger
    while lg is not None:
        if any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in lg.handlers):
            return True
        lg = lg.parent if lg.propagate else None
    return False


# ------------------------------------------------------------------------ one live process per folder
# ------------------------------------------------------------------------ a job's "running" marker
# A job's results.json is written when it ends (ok or failed), so without a marker a job still running -- in another
# multirun writing into the same sweep dir, or a launcher's other worker -- and one that was killed look alike.

RUNNING = ".running.json"
HEARTBEAT_S = 60.0  # a running job touches its marker this often (its mtime is the heartbeat)
STALE_HEARTBEATS = 10  # another host's marker whose heartbeat is older than this many periods: the job was killed
_heartbeats: dict[str, tuple] = {}  # out_dir -> (the threading.Event that stops its heartbeat, its marker's identity)


def global_rank() -> int:
    """This process's rank in a multi-process (DDP) job: ``RANK`` (torchrun, Lightning), ``SLURM_PROCID`` (srun), else
    ``LOCAL_RANK``; 0 for a one-process job."""
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(var, "").strip().isdigit():
            return int(os.environ[var])
    return 0


def mark_running(out_dir: Path, heartbeat_s: float = HEARTBEAT_S) -> None:
    """Write ``<out_dir>/.running.json`` (pid, the process's start time, host, start time) when a job starts;
    ``clear_running`` removes it when the job ends either way. Left behind, it names the process that was killed.
    While the job runs a daemon thread touches the marker every ``heartbeat_s`` seconds, so a sweep summary on another
    host (a cluster launcher's workers) tells a running job (fresh heartbeat) from a killed one (stale)."""
    import socket
    import threading
    import time

    out_dir = Path(out_dir)
    ident = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    tmp = out_dir / f"{RUNNING}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**ident, "proc_start": _proc_start(os.getpid()),
                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "heartbeat_s": heartbeat_s}))
    os.replace(tmp, out_dir / RUNNING)
    _stop_heartbeat(out_dir)
    stop = threading.Event()
    _heartbeats[str(out_dir)] = (stop, ident)
    threading.Thread(target=_beat, args=(out_dir / RUNNING, heartbeat_s, stop, ident), daemon=True,
                     name=f"mlmlab-heartbeat:{out_dir.name}").start()


def _ours(marker: Path, ident: dict) -> bool:
    """Whether the marker file is still the one ``ident`` wrote (not another attempt's that replaced it)."""
    m = json.loads(marker.read_text())
    return isinstance(m, dict) and all(m.get(k) == v for k, v in ident.items())


def _beat(marker: Path, period: float, stop, ident: dict) -> None:
    while not stop.wait(period):
        try:
            if not _ours(marker, ident):  # another attempt (a rerun elsewhere) replaced it: its own heartbeat's job
                return
            os.utime(marker)
        except FileNotFoundError:  # cleared (or the dir removed): nothing left to keep alive
            return
        except (OSError, ValueError) as e:  # a flaky shared filesystem: keep trying, never fail the job over it
            log.debug("heartbeat on %s failed (%s)", marker, e)


def _stop_heartbeat(out_dir: Path) -> dict | None:
    """Stop the heartbeat of ``out_dir``'s marker; returns the marker's identity (None when it had none here)."""
    stop, ident = _heartbeats.pop(str(Path(out_dir)), (None, None))
    if stop is not None:
        stop.set()
    return ident


def clear_running(out_dir: Path) -> None:
    """Remove the job's marker -- only its own: one that another attempt wrote over it (a rerun of the same job dir,
    elsewhere) is that attempt's to clear."""
    import socket

    marker = Path(out_dir) / RUNNING
    ident = _stop_heartbeat(out_dir) or {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        if _ours(marker, ident):
            marker.unlink(missing_ok=True)
        else:
            log.info("left %s: another attempt's marker", marker)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:  # never let the marker hide the job's own outcome
        log.warning("could not remove %s (%s)", marker, e)


def running_state(job_dir: Path, now: float | None = None) -> dict | None:
    """What a job dir's marker says, or None when it has none (or the job's record is newer than it):
    ``running`` while its process lives on this host; ``missing`` (killed) when it is gone. On another host, where
    the process cannot be checked, the marker's heartbeat (its mtime) decides: ``running`` while it is fresher than
    ``STALE_HEARTBEATS`` periods, ``missing`` (killed) when older; ``unknown`` (not ok) for a marker without one."""
    import socket
    import time

    job_dir = Path(job_dir)
    try:
        m = json.loads((job_dir / RUNNING).read_text())
        pid, host, started = int(m["pid"]), str(m["host"]), m.get("started_at")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"status": "missing", "error": f"no results.json; unreadable running marker ({e})"}
    record = job_dir / "results.json"
    try:  # a record written after this marker belongs to this attempt (a marker that could not be removed)
        if record.stat().st_mtime >= float(m.get("started", float("inf"))):
            return None
    except OSError:
        pass
    who = f"pid {pid} on {host}, started {started}"
    earlier = "; its results.json is an earlier attempt's" if record.exists() else ""
    if host != socket.gethostname():
        try:
            period = float(m["heartbeat_s"])
            age = max(0.0, (time.time() if now is None else now) - (job_dir / RUNNING).stat().st_mtime)
        except (KeyError, TypeError, ValueError, OSError):
            return {"status": "unknown",
                    "error": f"{who}: another host, no heartbeat -- running there or killed{earlier}"}
        if age <= STALE_HEARTBEATS * period:
            return {"status": "running", "error": f"{who} (another host, heartbeat {age:.0f} s ago){earlier}"}
        return {"status": "missing", "error": f"killed ({who}, another host: heartbeat stopped {age:.0f} s ago, "
                                             f"every {period:.0f} s while running){earlier or ': no results.json'}"}
    if _alive(pid, m.get("proc_start")):
        return {"status": "running", "error": who + earlier}
    return {"status": "missing", "error": f"killed ({who}, no longer running){earlier or ': no results.json'}"}


def unfinished_state(job_dir: Path, now: float | None = None) -> dict:
    """A job dir without results.json: its marker's state, or ``missing`` when it has no marker."""
    return running_state(job_dir, now) or {"status": "missing",
                                      "error": "no results.json and no running marker (killed before it started?)"}


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (Linux; None elsewhere or when the process is gone):
    [0] the state, [19] the start time in clock ticks since boot."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_start(pid: int, stat: list[str] | None = None) -> int | None:
    """The process's start time (None where /proc is not there): with the pid it names one process, so a recycled
    pid does not pass for the job."""
    stat = stat if stat is not None else _stat(pid)
    try:
        return int(stat[19]) if stat else None
    except (ValueError, IndexError):
        return None


def _alive(pid: int, proc_start: int | None = None) -> bool:
    if pid == os.getpid():  # this process's own job ended without clearing its marker: it is not running any more
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    stat = _stat(pid)
    if stat and stat[0] in ("Z", "X"):  # a zombie: exited, not yet reaped
        return False
    now = _proc_start(pid, stat)
    return proc_start is None or now is None or now == proc_start
