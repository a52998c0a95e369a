"""Fault drills behind the README's "Reliability" figures: ``python -m mlmlab.drill <what> [key=value ...]``.

- ``resume``: one uninterrupted run, then the same run SIGKILLed at random steps and resumed, again and again, until it
  finishes; prints whether the final parameters and the per-step loss log equal the uninterrupted run's.
- ``sweep``: a multirun SIGKILLed at random moments, re-run with ``skip_completed=true`` until every job is ok.
- ``cache``: N jobs started together on an empty cache; counts the cache builds.
- ``verify``: time to check a cache entry of a given size against its content hash (full and sampled).

Every job is the tiny ``debug=fast`` configuration on the built-in corpus (no downstream, no W&B): seconds per job.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlmlab.cli import Opt, usage
from mlmlab.cli import run as cli_run

ROOT = Path(__file__).resolve().parents[1]
BASE = ["debug=fast", "logger=none", "downstream=none", "data.n_docs=200", "trainer.log_every_n_steps=1"]


def _run(args: list[str], cache: Path, env: dict | None = None, kill_after: float | None = None):
    e = {**os.environ, "MLMLAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline", **(env or {})}
    p = subprocess.Popen([sys.executable, "-m", "mlmlab.train", *args], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
    return p.returncode, out


def drill_resume(a) -> dict:
    import torch

    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="drill_resume_"))
    cache = work / "cache"
    args = [*BASE, f"trainer.max_steps={a.steps}", f"trainer.checkpoint_every_n_steps={a.every}",
            "trainer.val_check_interval=10"]
    rc, out = _run([*args, f"hydra.run.dir={work / 'ref'}"], cache)
    assert rc == 0, out[-2000:]
    ref = torch.load(work / "ref" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    ref_log = (work / "ref" / "train_log.jsonl").read_text()
    rows = []
    for r in range(a.runs):
        run = work / f"run{r}"
        kills, step, resume = [], 0, []
        while True:
            kill = rng.randint(step + a.every, a.steps + a.every)  # past the next checkpoint; > steps: no kill
            env = {"MLMLAB_FAULT_KILL_AT_STEP": str(kill)} if kill <= a.steps else {}
            rc, out = _run([*args, f"hydra.run.dir={run}", *resume], cache, env)
            if rc == 0:
                break
            assert rc == -signal.SIGKILL, out[-2000:]
            kills.append(kill)
            step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
            resume = [f"resume={run}"]
        got = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
        diff = max(float((ref[k].float() - got[k].float()).abs().max()) for k in ref)
        rows.append({"run": r, "killed_at_steps": kills, "bitwise_equal": all(torch.equal(ref[k], got[k]) for k in ref),
                     "max_abs_param_diff": diff, "loss_log_equal": (run / "train_log.jsonl").read_text() == ref_log})
        print(json.dumps(rows[-1]), flush=True)
    return {"steps": a.steps, "checkpoint_every": a.every, "runs": rows,
            "kills": sum(len(r["killed_at_steps"]) for r in rows),
            "all_bitwise_equal": all(r["bitwise_equal"] for r in rows)}


def drill_sweep(a) -> dict:
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="drill_sweep_"))
    cache = work / "cache"
    sweep = work / "sweep"
    seeds = ",".join(str(i) for i in range(a.jobs))
    args = ["-m", *BASE, f"trainer.max_steps={a.steps}", f"seed={seeds}", f"hydra.sweep.dir={sweep}",
            "skip_completed=true"]
    _run([*BASE, "trainer.max_steps=1", f"hydra.run.dir={work / 'warm'}"], cache)  # build the cache once
    attempts = []
    for i in range(a.kills + 1):
        kill_after = rng.uniform(a.min_s, a.max_s) if i < a.kills else None
        t0 = time.perf_counter()
        rc, out = _run(args, cache, kill_after=kill_after)
        ok = [p.parent.name for p in sweep.glob("*/results.json") if json.loads(p.read_text())["status"] == "ok"]
        skipped = len(re.findall(r"skip_completed: .* is complete", out))
        attempts.append({"killed_after_s": round(kill_after, 1) if kill_after else None, "rc": rc,
                         "wall_s": round(time.perf_counter() - t0, 1), "skipped_complete": skipped,
                         "ok_after": len(ok)})
        print(json.dumps(attempts[-1]), flush=True)
    summary = json.loads((sweep / "summary.json").read_text())
    return {"jobs": a.jobs, "attempts": attempts, "final_summary": {k: summary[k] for k in ("jobs", "ok")}}


def drill_cache(a) -> dict:
    work = Path(tempfile.mkdtemp(prefix="drill_cache_"))
    cache = work / "cache"
    e = {**os.environ, "MLMLAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline"}
    procs = [subprocess.Popen([sys.executable, "-m", "mlmlab.train", *BASE, "trainer.max_steps=2",
                               f"data.n_docs={a.docs}", f"hydra.run.dir={work / f'job{i}'}"], cwd=ROOT, env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(a.jobs)]
    logs = [p.communicate()[0] for p in procs]
    built = [m.group(1) for log in logs for m in re.finditer(r"cache: built (\w+/\w+)/", log)]
    losses = {json.loads((work / f"job{i}" / "results.json").read_text())["metrics"]["val/mlm_loss_r15"]
              for i in range(a.jobs)}
    return {"jobs": a.jobs, "ok": sum(p.returncode == 0 for p in procs), "builds": len(built),
            "distinct_entries": len(set(built)), "entries": sorted(set(built)), "distinct_val_losses": len(losses)}


def drill_verify(a) -> dict:
    from mlmlab.data.cache import content_manifest, verify_entry

    work = Path(tempfile.mkdtemp(prefix="drill_verify_"))
    f = work / "entry" / "input_ids.npy"
    f.parent.mkdir()
    with open(f, "wb") as fh:
        for _ in range(a.mib):
            fh.write(os.urandom(1 << 20))
    t = time.perf_counter()
    m = content_manifest(f.parent)
    build_s = time.perf_counter() - t
    out = {"mib": a.mib, "manifest_s": round(build_s, 3)}
    for name, max_bytes in (("full", 1 << 62), ("sampled", 0)):
        t = time.perf_counter()
        assert verify_entry(f.parent, m, max_bytes) is None
        out[f"verify_{name}_s"] = round(time.perf_counter() - t, 3)
    f.unlink()
    return out


DRILLS = {
    "resume": {"runs": Opt("runs to kill and resume", 3, int), "steps": Opt("steps per run", 30, int),
               "every": Opt("checkpoint every N steps", 3, int)},
    "sweep": {"jobs": Opt("jobs in the multirun", 4, int), "steps": Opt("steps per job", 40, int),
              "kills": Opt("SIGKILLs of the whole multirun", 2, int),
              "min_s": Opt("earliest kill, seconds after a start", 8.0, float),
              "max_s": Opt("latest kill, seconds after a start", 25.0, float)},
    "cache": {"jobs": Opt("jobs started together", 4, int), "docs": Opt("built-in corpus documents", 3000, int)},
    "verify": {"mib": Opt("size of the cache entry to verify, MiB", 1024, int)},
}
PROG = "python -m mlmlab.drill"


def main(argv: list[str] | None = None) -> int:
    """``python -m mlmlab.drill <resume|sweep|cache|verify> [key=value ...]`` (:mod:`mlmlab.cli`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    what = argv[0] if argv and "=" not in argv[0] else None
    if what in ("help", "-h", "--help") or what is None:
        print(__doc__.split("\n\n")[0] + "\n\n" + "\n".join(usage(f"{PROG} {w}", o) for w, o in DRILLS.items()))
        return 0 if what else 2
    if what not in DRILLS:
        print(f"{PROG}: {what!r} is not a drill; allowed: {', '.join(DRILLS)}", file=sys.stderr)
        return 2
    opts = {**DRILLS[what], "seed": Opt("random seed of the kill times", 0, int)}
    fn = {"resume": drill_resume, "sweep": drill_sweep, "cache": drill_cache, "verify": drill_verify}[what]

    def body(a) -> int:
        print(json.dumps(fn(a), indent=1))
        return 0

    return cli_run(body, argv[1:], opts, f"{PROG} {what}")


if __name__ == "__main__":
    sys.exit(main())
