"""The end of a multirun: which jobs failed and why (``hydra.callbacks`` in conf/train.yaml)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


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
