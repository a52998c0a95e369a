"""Time to pay: after how many minutes of pretraining does a preset's encoder beat random init on its task?

Runs ``python -m mlmlab.train <overrides>`` at each pretraining budget (``trainer.budget.seconds``) for each
pretraining seed, fine-tuning at each label budget against the random-init encoder of the same seed and protocol
(``downstream.random_init_baseline``: computed once per seed and reused across budgets). Per job it keeps the record
(``results.json``, copied to ``--records``), the minutes actually spent pretraining, steps, tokens, the fixed-mask loss
``val/mlm_loss_r15`` and, per label budget, the paired gain over random init with its interval over fine-tuning seeds
(conditional on that encoder). Per budget and label budget it reports the gain's 95% t interval over the pretraining
seeds (the unit; :func:`mlmlab.stats.mean_interval`) and whether it pays by the one rule, :func:`mlmlab.stats.pays`:
that interval above the threshold (>= 2 seeds); how many seeds' own intervals reach the threshold is description
only. ``time_to_pay`` is the smallest budget that pays, per label budget and threshold (0 and the targets: +5 points at
500 labels, +3 at 4,000).

A time-to-pay run chooses (a recipe, a budget), so its jobs score the task's selection split by default
(``downstream.score_split=selection``: a fixed part held out of the task's train split, never trained on; the label
budgets come from the rest), not the split that reports findings (SST-2: GLUE dev). ``--score-split reported``
scores the reported split instead: for a confirmation of a recipe already chosen, never for a choice.

Jobs run ``--parallel`` at a time, each pinned to its own core with one torch thread (``taskset``), as a sweep runs
with ``hydra/launcher=cores``; the minutes are that regime's. Nothing else should run beside it.

    python benchmarks/bench_time_to_pay.py --name real_en --minutes 5 13 --seeds 0 1           # today's preset
    python benchmarks/bench_time_to_pay.py --name quick --quick                                # debug=fast: seconds
    python benchmarks/bench_time_to_pay.py --name x --screen --minutes 3 --overrides experiment=real_en model.num_layers=2
    python benchmarks/bench_time_to_pay.py --name y --minutes 5 --seeds 0 --labels 500 --overrides experiment=real_en_fast
``--screen``: pretraining only (no fine-tuning): the fixed-mask loss at the budget, for cheap recipe screens.
Jobs whose record is complete are not run again (``skip_completed``), so an interrupted benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO_ROOT, format_table, machine, versions, write_result
from report import TARGETS, over_seeds  # the targets: the gain's lower bound to reach by label budget


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="benchmarks/results/time_to_pay_<name>.json")
    p.add_argument("--overrides", nargs="*", default=None, help="the preset and its changes (default: "
                   "experiment=real_en; with --quick: none)")
    p.add_argument("--minutes", nargs="+", type=float, default=[5.0, 13.0], help="pretraining budgets, minutes")
    p.add_argument("--beside", default="nothing", help="what else ran on the machine (recorded with the timings)")
    p.add_argument("--steps", type=int, default=None, help="instead of a seconds budget: this many optimizer steps "
                   "(trainer.budget.seconds=null trainer.max_steps=<n>: the same run whatever runs beside it); the "
                   "one --minutes value names the budget the steps stand for")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="pretraining seeds")
    p.add_argument("--labels", nargs="+", type=int, default=[500, 4000], help="label budgets (training examples)")
    p.add_argument("--task", default="sst2")
    p.add_argument("--metric", default=None, help="the task's metric the gains are read on (default: its primary, "
                   "e.g. acc for sst2, entity_f1 for bc5cdr)")
    p.add_argument("--parallel", type=int, default=2, help="jobs at once, one core and one thread each")
    p.add_argument("--cores", nargs="+", type=int, default=None, help="the cores to pin jobs to (default: the first "
                   "--parallel); e.g. --cores 1 to run beside another benchmark on core 0")
    p.add_argument("--screen", action="store_true", help="pretraining only: the fixed-mask loss at each budget")
    p.add_argument("--score-split", choices=("selection", "reported"), default="selection",
                   help="the split the fine-tuned encoders are scored on (downstream.score_split): selection (default; "
                        "held out of the task's train split, for choosing) or reported (the task's evaluation split, "
                        "for a confirmation of a recipe already chosen)")
    p.add_argument("--quick", action="store_true", help="debug=fast on the built-in corpus, budgets in seconds")
    p.add_argument("--work", default=None, help="job dirs (default: <repo>/benchmarks/work/<name>)")
    p.add_argument("--records", default=None, help="copy each job's results.json here "
                                                   "(default: docs/results/time_to_pay/<name>/)")
    p.add_argument("--out", default=None, help="result JSON path or dir (default benchmarks/results/)")
    return p.parse_args(argv)


def job_args(a, minutes: float, seed: int) -> list[str]:
    args = list(a.overrides)
    if a.quick:
        args = ["debug=fast", "downstream.tasks=[builtin_sentiment]", "downstream.seeds=[0,1]", *args]
    budget = [f"trainer.budget.seconds={minutes * 60:g}"] if a.steps is None else \
        ["trainer.budget.seconds=null", f"trainer.max_steps={a.steps}"]
    args += [*budget, f"seed={seed}", "skip_completed=true"]
    if a.screen:
        args += ["downstream.tasks=[]"]
    else:
        args += [f"downstream.max_train_examples=[{','.join(map(str, a.labels))}]",
                 "downstream.random_init_baseline=true", f"downstream.score_split={a.score_split}"]
    return args


def run_job(a, minutes: float, seed: int, core: int | None, work: Path) -> dict:
    out = work / f"m{minutes:g}_s{seed}"
    cmd = [sys.executable, "-m", "mlmlab.train", *job_args(a, minutes, seed), f"hydra.run.dir={out}",
           "logger.wandb.mode=offline"]
    env = dict(os.environ, WANDB_MODE="offline")
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd, "trainer.threads=1"]
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    (work / f"m{minutes:g}_s{seed}.log").write_text(p.stdout[-20000:] + p.stderr[-20000:])
    if p.returncode != 0:
        raise RuntimeError(f"job m{minutes:g} seed {seed} failed ({p.returncode}): {p.stderr[-1500:]}")
    return {"minutes": minutes, "seed": seed, "core": core, "wall_s": time.time() - t0, "dir": str(out)}


def metric_of(a) -> str:
    """--metric, or the task's primary metric (mlmlab/tasks/<task>.yaml)."""
    if a.metric or a.quick:
        return a.metric or "acc"
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.data.tasks import TASKS

    return TASKS[a.task].main_metric


def row(a, job: dict) -> dict:
    r = json.loads((Path(job["dir"]) / "results.json").read_text())
    m, t = r["metrics"], r.get("timings_s") or {}
    out = {"minutes": job["minutes"], "seed": job["seed"], "pretrain_min": t.get("pretrain", float("nan")) / 60,
           "steps": m.get("train/steps"), "tokens": (r.get("budget") or {}).get("tokens"),
           "val_loss": m.get("val/mlm_loss_r15"), "torch_threads": r["machine"].get("torch_threads"),
           "commit": (r.get("git") or {}).get("commit"), "gains": {}}
    task = "builtin_sentiment" if a.quick else a.task
    metric = metric_of(a)
    for n in ([] if a.screen else a.labels):
        out.setdefault("scored_on", (r["downstream"].get(f"{task}@{n}") or {}).get("reported_split"))
        key = f"gain/{task}@{n}/{metric}"
        g = m.get(key)
        half = m.get(f"{key}_ci95")
        out["gains"][str(n)] = {"gain": g, "low": None if g is None or half is None else g - half,
                                "high": None if g is None or half is None else g + half, "p": m.get(f"{key}_p"),
                                metric: m.get(f"downstream/{task}@{n}/{metric}"),
                                "random_init": m.get(f"random_init/{task}@{n}/{metric}")}
    return out, r


def summarize(a, rows: list[dict]) -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.stats import pays

    per = {}
    for n in ([] if a.screen else a.labels):
        thresholds = sorted({0.0, TARGETS.get(n, 0.0)})
        budgets = []
        for minutes in sorted({r["minutes"] for r in rows}):
            rs = [r for r in rows if r["minutes"] == minutes]
            iv, lows = over_seeds(rs, n)
            gains = [r["gains"][str(n)]["gain"] for r in rs if r["gains"][str(n)]["gain"] is not None]
            entry = {"minutes": minutes, "seeds": len(lows), "pretrain_min": max(r["pretrain_min"] for r in rs),
                     "mean_gain": sum(gains) / len(gains) if gains else None,
                     "low": iv.low if iv else None, "high": iv.high if iv else None}
            entry.update({f"pays_above_{th:g}": bool(pays(gains, threshold=th)) for th in thresholds})  # the one rule
            entry.update({f"seeds_reaching_{th:g}": sum(1 for low in lows if low is None or low <= th)  # description
                          for th in thresholds})
            budgets.append(entry)
        per[str(n)] = {"budgets": budgets, "time_to_pay": {
            f"above_{th:g}": next((b["pretrain_min"] for b in budgets if b[f"pays_above_{th:g}"]), None)
            for th in thresholds}}
    loss = [{"minutes": m, "pretrain_min": sum(r["pretrain_min"] for r in rows if r["minutes"] == m)
             / max(1, sum(1 for r in rows if r["minutes"] == m)),
             "val_loss": [r["val_loss"] for r in rows if r["minutes"] == m]} for m in sorted({r["minutes"] for r in rows})]
    return {"by_labels": per, "loss_curve": loss}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.steps is not None and len(a.minutes) != 1:
        raise SystemExit(f"--steps {a.steps} stands for one budget; give one --minutes value (got {a.minutes})")
    if a.overrides is None:
        a.overrides = [] if a.quick else ["experiment=real_en"]
    if a.quick:
        a.minutes = [m / 60 for m in a.minutes] if a.minutes != [5.0, 13.0] else [2 / 60, 4 / 60]
        a.labels = [16, 32] if a.labels == [500, 4000] else a.labels
    work = Path(a.work) if a.work else REPO_ROOT / "benchmarks" / "work" / a.name
    records = Path(a.records) if a.records else REPO_ROOT / "docs" / "results" / "time_to_pay" / a.name
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(m, s) for m in a.minutes for s in a.seeds]
    cores = a.cores or (list(range(a.parallel)) if a.parallel > 1 else [None])
    t0 = time.time()
    done = []
    with ThreadPoolExecutor(max_workers=len(cores)) as pool:  # job i on core i % parallel: pairs side by side
        for batch in range(0, len(jobs), len(cores)):
            futs = [pool.submit(run_job, a, m, s, core, work) for (m, s), core in zip(jobs[batch:batch + len(cores)], cores)]
            done += [f.result() for f in futs]
    rows = []
    records.mkdir(parents=True, exist_ok=True)
    for job in done:
        r, record = row(a, job)
        rows.append(r)
        shutil.copyfile(Path(job["dir"]) / "results.json", records / f"m{job['minutes']:g}_s{job['seed']}.json")
    sys.path.insert(0, str(REPO_ROOT))
    from mlmlab.hardware import cpu_kind

    payload = {"machine": machine(), "cpu": cpu_kind(), "versions": versions(), "overrides": a.overrides, "task": a.task,
               "metric": None if a.screen else metric_of(a),
               "labels": a.labels, "steps": a.steps, "beside": a.beside, "parallel": len(cores), "cores": cores, "screen": a.screen, "quick": a.quick,
               "score_split": None if a.screen else a.score_split,
               "total_wall_s": time.time() - t0, "records": str(records.relative_to(REPO_ROOT))
               if records.is_relative_to(REPO_ROOT) else str(records),
               "rows": rows, "summary": summarize(a, rows)}
    path = write_result(f"time_to_pay_{a.name}", payload, a.out)
    cols = [("minutes", "budget min", "g"), ("seed", "seed", "d"), ("pretrain_min", "pretrain min", ".1f"),
            ("steps", "steps", ".0f"), ("val_loss", "val loss", ".3f")]
    flat = [{**r, **{f"g{n}": (r["gains"].get(str(n)) or {}).get("gain") for n in a.labels}} for r in rows]
    cols += [] if a.screen else [(f"g{n}", f"gain@{n}", "+.3f") for n in a.labels]
    print(format_table(flat, cols))
    print(json.dumps(payload["summary"]["by_labels"], indent=1)[:3000])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
