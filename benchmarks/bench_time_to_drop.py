"""Time to drop: how many tokens and minutes of one core until an encoder's fixed-mask loss leaves the lexical phase.

Each arm (a recipe: overrides of ``python -m mlmlab.train``) pretrains for a fixed number of steps with validation every
``--val-every`` steps; its record's validation curve (results.json ``val_curve``: step, tokens, training seconds,
``val/mlm_loss_r15``) gives the tokens and training minutes until the loss reaches ``--target`` (4.5 nats: issue 53's
"past the drop" on IMDB) and until it falls below the bigram reference by the phase margin (the phase rule,
mlmlab.phase), and the loss at 5, 10 and 20 minutes of training. Arms compare at equal steps, so the curve against
tokens does not depend on the machine; the minutes do (the CPU kind is recorded; nothing else may run beside a timed
screen). Jobs run ``--parallel`` at a time, each pinned to its own core with one torch thread, as a sweep's jobs run
with ``hydra/launcher=cores``. Pretraining only, scored on held-out IMDB text (validation blocks): a screen ranks
recipes, it decides nothing.

    python benchmarks/bench_time_to_drop.py --name rope --steps 3000 \\
        --arm learned "experiment=real_en_fast" --arm rope "experiment=real_en_fast model.position=rope"

Records are copied to ``docs/results/time_to_drop/<name>/<arm>_s<seed>.json`` (the tables render from them), the
summary to ``benchmarks/results/time_to_drop_<name>.json``. Jobs whose record is complete are not run again
(``skip_completed``), so an interrupted screen resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO_ROOT, cpu_label, format_table, machine, versions, write_result

MINUTES = (5, 10, 20)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="benchmarks/results/time_to_drop_<name>.json")
    p.add_argument("--arm", nargs=2, action="append", required=True, metavar=("NAME", "OVERRIDES"),
                   help="an arm: its name and its overrides as one quoted string (repeat for each arm)")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps per job (the schedule's length)")
    p.add_argument("--val-every", type=int, default=250, help="validation every n steps (the curve's resolution)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="pretraining seeds")
    p.add_argument("--target", type=float, default=4.5, help="the fixed-mask loss to reach, nats")
    p.add_argument("--parallel", type=int, default=2, help="jobs at once, one core and one thread each")
    p.add_argument("--cores", nargs="+", type=int, default=None, help="the cores to pin jobs to (default: the first "
                   "--parallel cores; one core: --cores 1, e.g. beside another screen on core 0)")
    p.add_argument("--beside", default="nothing", help="what else ran on the machine (recorded with the timings)")
    p.add_argument("--work", default=None, help="job dirs (default: <repo>/benchmarks/work/drop_<name>)")
    p.add_argument("--records", default=None, help="copy records here (default docs/results/time_to_drop/<name>)")
    p.add_argument("--out", default=None, help="result JSON path or dir (default benchmarks/results/)")
    a = p.parse_args(argv)
    names = [n for n, _ in a.arm]
    if len(set(names)) != len(names):
        p.error(f"--arm names must differ; got {names}")
    if a.steps < 1 or a.val_every < 1:
        p.error(f"--steps={a.steps} and --val-every={a.val_every} must be >= 1")
    return a


def job_cmd(a, overrides: str, seed: int, out: Path, core: int | None) -> tuple[list[str], dict]:
    cmd = [sys.executable, "-m", "mlmlab.train", *shlex.split(overrides), "trainer.budget.seconds=null",
           f"trainer.max_steps={a.steps}", f"trainer.val_check_interval={a.val_every}", "downstream.tasks=[]",
           "logger=none", f"seed={seed}", "skip_completed=true", f"hydra.run.dir={out}"]
    env = dict(os.environ)
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd, "trainer.threads=1"]
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return cmd, env


def run_job(a, arm: str, overrides: str, seed: int, core: int | None, work: Path) -> dict:
    out = work / f"{arm}_s{seed}"
    cmd, env = job_cmd(a, overrides, seed, out, core)
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    (work / f"{arm}_s{seed}.log").write_text(p.stdout[-20000:] + p.stderr[-20000:])
    if p.returncode != 0:
        raise RuntimeError(f"arm {arm} seed {seed} failed ({p.returncode}): {p.stderr[-1500:]}")
    return {"arm": arm, "overrides": overrides, "seed": seed, "core": core, "wall_s": time.time() - t0, "dir": str(out)}


def row(a, job: dict) -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.phase import loss_at, reach

    r = json.loads((Path(job["dir"]) / "results.json").read_text())
    m, curve, ph = r["metrics"], r.get("val_curve") or [], r.get("phase") or {}
    bigram_mark = ph["bigram"] - ph["margin"] if ph else None
    return {"arm": job["arm"], "overrides": job["overrides"], "seed": job["seed"], "core": job["core"],
            "steps": m.get("train/steps"), "tokens": curve[-1]["tokens"] if curve else None,
            "train_s": curve[-1]["train_s"] if curve else None,
            "tokens_per_s": (r.get("throughput") or {}).get("tokens_per_s"), "val_loss": m.get("val/mlm_loss_r15"),
            "unigram": ph.get("unigram"), "bigram": ph.get("bigram"), "phase": ph.get("label"),
            "reach_target": reach(curve, a.target), "reach_bigram": None if bigram_mark is None else reach(curve, bigram_mark),
            "loss_at_min": {str(mn): loss_at(curve, 60 * mn) for mn in MINUTES},
            "params": (r.get("model") or {}).get("parameters"), "commit": (r.get("git") or {}).get("commit"),
            "torch_threads": r["machine"].get("torch_threads")}


def main(argv=None) -> int:
    a = parse_args(argv)
    work = Path(a.work) if a.work else REPO_ROOT / "benchmarks" / "work" / f"drop_{a.name}"
    records = Path(a.records) if a.records else REPO_ROOT / "docs" / "results" / "time_to_drop" / a.name
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(arm, ov, s) for s in a.seeds for arm, ov in a.arm]
    cores = a.cores or (list(range(a.parallel)) if a.parallel > 1 else [None])
    t0 = time.time()
    done = []
    with ThreadPoolExecutor(max_workers=len(cores)) as pool:  # job i on core i % parallel: pairs side by side
        for batch in range(0, len(jobs), len(cores)):
            futs = [pool.submit(run_job, a, arm, ov, s, core, work)
                    for (arm, ov, s), core in zip(jobs[batch:batch + len(cores)], cores)]
            done += [f.result() for f in futs]
    records.mkdir(parents=True, exist_ok=True)
    rows = []
    for job in done:
        rows.append(row(a, job))
        shutil.copyfile(Path(job["dir"]) / "results.json", records / f"{job['arm']}_s{job['seed']}.json")
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.hardware import cpu_kind

    payload = {"machine": machine(), "cpu": cpu_kind(), "cpu_label": cpu_label(), "versions": versions(),
               "steps": a.steps, "val_every": a.val_every, "target": a.target, "seeds": a.seeds,
               "parallel": len(cores), "beside": a.beside, "total_wall_s": time.time() - t0,
               "records": str(records.relative_to(REPO_ROOT)) if records.is_relative_to(REPO_ROOT) else str(records),
               "rows": rows}
    path = write_result(f"time_to_drop_{a.name}", payload, a.out)
    flat = [{**r, "to_target": (r["reach_target"] or {}).get("tokens"), "at10": r["loss_at_min"]["10"]} for r in rows]
    print(format_table(flat, [("arm", "arm", "s"), ("seed", "seed", "d"), ("steps", "steps", ".0f"),
                              ("train_s", "train s", ".0f"), ("val_loss", "val loss", ".3f"), ("phase", "phase", "s"),
                              ("to_target", f"tokens to {a.target:g}", ".0f"), ("at10", "loss at 10 min", ".3f")]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
