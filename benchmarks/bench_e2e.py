"""Wall time and peak memory of one default job, ``python -m mlmlab.train``, from a cold cache.

Runs the job as a subprocess from the repository root with a fresh cache (env ``MLMLAB_CACHE_DIR=<tmp>/cache``),
``hydra.run.dir=<tmp>/run`` and ``logger.wandb.mode=offline``; reads the phase split (data / pretrain / eval /
downstream) from the job's ``results.json`` "timings_s"; peak RSS from ``/usr/bin/time -v`` when present, else
``getrusage(RUSAGE_CHILDREN)``.

    python benchmarks/bench_e2e.py                               # the default job: several minutes on 2 cores
    python benchmarks/bench_e2e.py --quick --out /tmp/bench      # debug=fast: seconds
    python benchmarks/bench_e2e.py --overrides mask.rate=0.4 trainer.max_steps=200
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO_ROOT, format_table, machine, versions, write_result

GNU_TIME = "/usr/bin/time"
PHASES = {"data": "data", "pretrain": "pretrain", "eval": "eval", "downstream": "finetune"}  # ours: results.json key


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="prepend debug=fast (a seconds-long job)")
    p.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides passed through to mlmlab.train")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the job is killed")
    p.add_argument("--keep", action="store_true", help="keep the temporary run/cache dir (its path is printed)")
    p.add_argument("--out", help="result file or directory (default benchmarks/results/bench_e2e.json)")
    args = p.parse_args(argv)
    args.overrides = (["debug=fast"] if args.quick else []) + list(args.overrides)
    return args


def command(tmp: Path, overrides: list[str], time_file: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "mlmlab.train", f"hydra.run.dir={tmp / 'run'}"]
    if not any(o.lstrip("+~").startswith("logger") for o in overrides):  # logger=none has no wandb.mode to set
        cmd.append("logger.wandb.mode=offline")
    cmd += overrides
    return ([GNU_TIME, "-v", "-o", str(time_file)] + cmd) if time_file is not None else cmd


def parse_gnu_time(text: str) -> dict:
    """The few fields of ``/usr/bin/time -v`` worth keeping (kbytes -> MiB)."""
    fields = {"Maximum resident set size (kbytes)": "peak_rss_kb", "User time (seconds)": "user_s",
              "System time (seconds)": "sys_s", "Percent of CPU this job got": "cpu_percent",
              "Exit status": "exit_status"}
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in fields:
            out[fields[key]] = float(re.sub(r"[^0-9.]", "", value) or "nan")
    return out


def run_job(args, tmp: Path) -> dict:
    env = {**os.environ, "MLMLAB_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    time_file = tmp / "time.txt" if Path(GNU_TIME).is_file() and os.access(GNU_TIME, os.X_OK) else None
    cmd = command(tmp, args.overrides, time_file)
    log = tmp / "job.log"
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:  # own process group, so a timeout ends the job and not only /usr/bin/time
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    wall = time.perf_counter() - t0
    out = {"command": cmd, "returncode": rc, "wall_s": wall, "log_tail": log.read_text()[-3000:]}
    if time_file is not None and time_file.exists():
        gt = parse_gnu_time(time_file.read_text())
        out.update({"peak_rss_mib": gt.pop("peak_rss_kb", float("nan")) / 1024, "rss_method": "/usr/bin/time -v",
                    **gt})
    else:  # Linux: ru_maxrss in KiB, the largest of the waited-for children (here: the job)
        out.update({"peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                    "rss_method": "getrusage(RUSAGE_CHILDREN)"})
    return out


def summarize(job: dict, record: dict | None) -> dict:
    t = (record or {}).get("timings_s") or {}
    res = {"status": (record or {}).get("status", "missing"), "wall_s": job["wall_s"],
           "peak_rss_mib": job["peak_rss_mib"], "timings_s": t}
    for name, key in PHASES.items():
        res[f"{name}_s"] = t.get(key)
    if "total" in t:
        phases = sum(v for v in (t.get(k) for k in PHASES.values()) if v is not None)
        res["other_in_job_s"] = t["total"] - phases  # setup inside train(): config, models, Trainer, results
        res["startup_s"] = job["wall_s"] - t["total"]  # interpreter, imports, Hydra compose, until the record starts
    metrics = (record or {}).get("metrics") or {}
    res["metrics"] = {k: v for k, v in metrics.items()
                      if k in ("train/steps", "downstream/score") or k.startswith("val/mlm_")}
    return res


def main(argv=None) -> dict:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mlmlab_bench_e2e_"))
    try:
        job = run_job(args, tmp)
        rpath = tmp / "run" / "results.json"
        record = json.loads(rpath.read_text()) if rpath.exists() else None
        res = summarize(job, record)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    settings = {"quick": args.quick, "overrides": args.overrides, "command": job["command"],
                "env": {"MLMLAB_CACHE_DIR": "<fresh tmp dir>/cache"}, "rss_method": job["rss_method"],
                "timeout_s": args.timeout}
    extra = {k: job[k] for k in ("user_s", "sys_s", "cpu_percent") if k in job}
    payload = {"machine": machine(), "versions": versions(), "settings": settings,
               "results": {**res, **extra, "returncode": job["returncode"]}}
    if job["returncode"] != 0 or res["status"] != "ok":
        payload["results"]["log_tail"] = job["log_tail"]
    path = write_result("bench_e2e", payload, args.out)
    cols = [(k, k, ".1f") for k in ("wall_s", "startup_s", "data_s", "pretrain_s", "eval_s", "downstream_s",
                                    "other_in_job_s", "peak_rss_mib")]
    print(format_table([res], [("status", "status", "s")] + cols))
    print(f"wrote {path}")
    if job["returncode"] != 0 or res["status"] != "ok":
        print(job["log_tail"], file=sys.stderr)
        sys.exit(1)
    return payload


if __name__ == "__main__":
    main()
