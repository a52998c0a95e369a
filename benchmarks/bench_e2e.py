"""Wall time and peak memory of one default job, ``python -m mlmlab.train``, from a cold cache.

Runs the job as a subprocess from the repository root with a fresh cache (env ``MLMLAB_CACHE_DIR=<tmp>/cache``),
``hydra.run.dir=<tmp>/run`` and ``logger.wandb.mode=offline``; reads the phase split (data / pretrain / eval /
downstream) from the job's ``results.json`` "timings_s"; peak RSS from ``/usr/bin/time -v`` when present, else
``getrusage(RUSAGE_CHILDREN)``.

    python benchmarks/bench_e2e.py                               # the default job: several minutes on 2 cores
    python benchmarks/bench_e2e.py --quick --out /tmp/bench      # debug=fast: seconds
    python benchmarks/bench_e2e.py --overrides mask.rate=0.4 trainer.max_steps=200

After the job, unless ``--no-step``, one optimizer step of the job's own encoder config is timed in this process at the
job's batch, block length, mask rate, precision and thread count, as ``bench_step.py`` times it (a pre-masked batch,
no data loading, no logging): ``job_over_step`` = the job's tokens/s (results.json ``throughput``: median interval
between training steps, validation left out) / that step's tokens/s. Target: >= 0.9 as features land.
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
    p.add_argument("--no-step", action="store_true", help="skip timing the bare step (no job_over_step)")
    p.add_argument("--step-iters", type=int, default=30, help="timed steps of the bare step (median)")
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


def step_reference(record: dict, iters: int, threads: int | None) -> dict:
    """The bare step (bench_step.py's ``ours`` row) at the job's shape, batch, mask rate, precision and threads."""
    import torch
    from bench_step import make_batch, ours_loss, time_steps

    from mlmlab.models.encoder import BertForMLM, EncoderConfig

    keys = EncoderConfig.__dataclass_fields__
    enc = EncoderConfig(**{k: v for k, v in record["model"].items() if k in keys})
    c = record["config"]
    batch, seq = c["data"]["batch_size"] * c["trainer"]["accumulate_grad_batches"], c["data"]["max_seq_len"]
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = BertForMLM(enc)
    b = make_batch(enc.vocab_size, batch, seq, float(c["mask"]["rate"]), 0)
    bf16 = str(record.get("precision", "")).startswith("bf16")
    t = time_steps(model, ours_loss, b, warmup=3, iters=iters, autocast=bf16)
    return {"step_s_median": t["step_s"], "tokens_per_s": batch * seq / t["step_s"], "batch": batch, "seq": seq,
            "precision": "bf16 autocast" if bf16 else "fp32", "threads": torch.get_num_threads(), "iters": iters}


def main(argv=None) -> dict:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mlmlab_bench_e2e_"))
    try:
        job = run_job(args, tmp)
        rpath = tmp / "run" / "results.json"
        record = json.loads(rpath.read_text()) if rpath.exists() else None
        res = summarize(job, record)
        speed = (record or {}).get("throughput") or {}
        if speed.get("tokens_per_s"):
            res["job_tokens_per_s"], res["job_step_s_median"] = speed["tokens_per_s"], speed["step_s_median"]
            if not args.no_step:
                threads = ((record or {}).get("machine") or {}).get("torch_threads")
                res["step"] = step_reference(record, args.step_iters, threads)
                res["job_over_step"] = speed["tokens_per_s"] / res["step"]["tokens_per_s"]
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
    if "job_over_step" in res:
        print(f"job {res['job_tokens_per_s']:.0f} tokens/s, bare step {res['step']['tokens_per_s']:.0f} tokens/s "
              f"({res['step']['precision']}, {res['step']['threads']} threads): job_over_step "
              f"{res['job_over_step']:.3f} (target >= 0.9)")
    print(f"wrote {path}")
    if job["returncode"] != 0 or res["status"] != "ok":
        print(job["log_tail"], file=sys.stderr)
        sys.exit(1)
    return payload


if __name__ == "__main__":
    main()
