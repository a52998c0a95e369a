"""A sweep that stops when its question is settled: ``analysis.sequential`` of a sweep file (or the command line).

The pretraining seed is the unit: every arm of the grid runs the same seeds, a round at a time (both arms of a seed in
the same round), and after each round the group-sequential paired t of :func:`mlmlab.stats.sequential` is applied to
the primary metric, each arm against the first (the baseline). An arm that is decided (better / worse / equivalent)
runs no more seeds; the sweep ends when every arm is decided or ``max_seeds`` is reached. With several arms, alpha is
split evenly between them (Bonferroni; each arm's boundaries at ``alpha / (arms - 1)``).

This module plans the rounds and scores them from the jobs' results.json; it knows nothing of Hydra. The Hydra sweeper
that launches the rounds is ``hydra_plugins.mlmlab_sweeper`` (Hydra's default sweeper once mlmlab is installed).
Re-running the sweep's one-liner replays it: the finished jobs are not run again (``skip_completed``), the rounds
already scored give the same decisions, and it goes on from the first job without a record. Under another plan it is
refused (the folder's ``sequential.json`` declares the plan) unless ``analysis.sequential.replan=true``, which records
the change there (:func:`check_plan`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mlmlab import stats
from mlmlab.errors import ConfigError
from mlmlab.results import dumps

STATE = "sequential.json"  # <sweep dir>/sequential.json: the rounds so far and each arm's decision
DECIDED = ("better", "worse", "equivalent")


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    arm: int
    seed: int


@dataclass
class Plan:
    """The jobs of a sequential sweep: ``arms`` (override lists without ``seed``; the first is the baseline) x
    ``seeds`` (in the order they run), looked at after ``looks[k]`` seeds."""
    arms: list[tuple[str, ...]]
    seeds: list[int]
    question: stats.Question

    @property
    def looks(self) -> tuple[int, ...]:
        return self.question.sequential.looks()

    def round_jobs(self, k: int, active: Sequence[int]) -> list[Job]:
        """Round ``k`` (0-based): the seeds from the previous look to this one, for the baseline and ``active`` arms,
        seed by seed (both arms of a seed side by side, so two jobs at once run one seed's pair)."""
        lo = self.looks[k - 1] if k else 0
        arms = [0, *[a for a in active if a != 0]]
        return [Job((*self.arms[a], f"seed={s}"), a, s) for s in self.seeds[lo:self.looks[k]] for a in arms]

    def all_jobs(self) -> list[Job]:
        return [Job((*a, f"seed={s}"), i, s) for s in self.seeds for i, a in enumerate(self.arms)]

    @property
    def alpha(self) -> float:
        return self.question.alpha / max(1, len(self.arms) - 1)


def plan(fixed: Sequence[str], swept: dict[str, list[str]], question: stats.Question) -> Plan:
    """The plan of a grid: ``fixed`` overrides (``key=value``) and ``swept`` ones (key -> values, in order); ``seed``
    among the swept keys gives the seeds' order (exactly ``max_seeds`` of them), else seeds 0..max_seeds-1. A
    ConfigError (naming the key) for what the rule cannot run."""
    seq = question.sequential
    if not question.primary:
        raise ConfigError("analysis.sequential needs analysis.primary: the metric the rounds are decided on")
    if any(k.startswith("analysis") for k in swept):
        raise ConfigError(f"analysis.* is swept ({', '.join(k for k in swept if k.startswith('analysis'))}); a "
                          "sequential sweep asks one question")
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in fixed):
        raise ConfigError("seed is fixed, but analysis.sequential runs pretraining seeds in rounds: drop seed= (seeds "
                          f"0..{seq.max_seeds - 1}) or list {seq.max_seeds} seeds")
    seeds = [int(v) for v in swept.pop("seed", [str(s) for s in range(seq.max_seeds)])]
    if len(seeds) != seq.max_seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seed lists {len(seeds)} seeds ({','.join(map(str, seeds))}) but "
                          f"analysis.sequential.max_seeds={seq.max_seeds}; list {seq.max_seeds} distinct seeds or drop "
                          "seed from the grid")
    arms: list[tuple[str, ...]] = [tuple(fixed)]
    for key, values in swept.items():
        arms = [(*a, f"{key}={v}") for a in arms for v in values]
    if len(arms) < 2:
        raise ConfigError("analysis.sequential compares arms, but the grid sweeps nothing besides seed; sweep the "
                          "question's key (e.g. mask.rate=0.15,0.4), its first value the baseline")
    return Plan(arms, seeds, question)


def primary_value(record: dict, metric: str, where: str) -> float:
    """The primary metric of an ok job's record; a ConfigError when the job did not log it."""
    value = (record.get("metrics") or {}).get(metric)
    if value is None:
        raise ConfigError(f"analysis.primary={metric} is not among the metrics of {where}; the rounds cannot be "
                          "scored (declare a metric the job logs)")
    return float(value)


def decide(p: Plan, values: dict[tuple[int, int], float], active: Sequence[int]) -> dict[int, stats.SequentialResult]:
    """Each active arm's decision from the primary metric of every (arm, seed) run so far: the per-seed differences
    against the baseline, in the plan's seed order, through the group-sequential rule."""
    q = p.question
    out = {}
    for a in active:
        diffs = [values[a, s] - values[0, s] for s in p.seeds if (a, s) in values and (0, s) in values]
        out[a] = stats.sequential(diffs, q.sequential, q.delta, stats.higher_is_better(q.primary), p.alpha)
    return out


def arm_name(p: Plan, a: int) -> str:
    """An arm by the overrides that tell it from the others (all of them when nothing does)."""
    common = set.intersection(*map(set, p.arms))
    return " ".join(o for o in p.arms[a] if o not in common) or " ".join(p.arms[a]) or "(defaults)"


def state(p: Plan, k: int, results: dict[int, tuple[int, stats.SequentialResult]], jobs_run: int,
          replans: Sequence[dict] = ()) -> dict:
    """The sweep's sequential state after round ``k`` (0-based), as written to ``sequential.json``: per arm its
    decision (or ``continue``), the round it was reached at, the repeated confidence interval at that look
    (``low``/``high``, its nominal per-look ``level``), the look's ``boundary`` and paired ``t``, the
    stagewise-ordering p (``p_stagewise``: null while the arm runs on or where it stopped for equivalence) and the
    repeated p (``p_repeated``), both at the arm's alpha; ``replans``: the plan's recorded changes
    (:func:`check_plan`), when there were any."""
    def num(v: float) -> float | None:
        return None if v is None or v != v else float(v)

    arms = []
    for a in range(1, len(p.arms)):
        rnd, r = results[a]
        iv = r.interval
        arms.append({"arm": arm_name(p, a), "verdict": r.verdict, "round": rnd, "seeds": r.n, "diff": iv.mean,
                     "low": iv.low, "high": iv.high, "level": iv.level, "boundary": r.boundary, "t": num(r.t),
                     "p_stagewise": num(r.p_stagewise), "p_repeated": num(r.p_repeated)})
    return {"metric": p.question.primary, "baseline": arm_name(p, 0), "delta": p.question.delta,
            "alpha": p.question.alpha, "alpha_per_arm": p.alpha, "plan": plan_fields(p.question.sequential),
            "looks": list(p.looks), "seeds": p.seeds, "rounds_run": k + 1, "jobs_run": jobs_run,
            "stopped": all(a["verdict"] != "continue" for a in arms), "arms": arms,
            **({"replans": list(replans)} if replans else {})}


def plan_fields(seq: stats.SequentialPlan) -> dict:
    """``analysis.sequential`` as the plan (``replan`` is how a rerun treats the folder, not part of it)."""
    return {k: v for k, v in asdict(seq).items() if k != "replan"}


def declared(s: dict) -> dict:
    """The plan and question a ``sequential.json`` declares, by key: ``analysis.primary/delta/alpha``,
    ``analysis.sequential.*``, the baseline and arms (by name) and the seeds in their order. A state from before
    ``min_seeds`` existed ran with ``min_seeds=2``."""
    out = {"analysis.primary": s.get("metric"), "analysis.delta": s.get("delta"), "analysis.alpha": s.get("alpha")}
    plan_d = dict(s.get("plan") or {})
    plan_d.setdefault("min_seeds", 2)
    out.update({f"analysis.sequential.{k}": v for k, v in plan_d.items() if k != "replan"})
    out["baseline"] = s.get("baseline")
    out["arms"] = [a.get("arm") for a in s.get("arms") or []]
    out["seeds"] = list(s.get("seeds") or [])
    return out


def plan_state(p: Plan) -> dict:
    """What :func:`declared` reads, for a plan that has not run a round yet."""
    return {"metric": p.question.primary, "delta": p.question.delta, "alpha": p.question.alpha,
            "plan": plan_fields(p.question.sequential), "baseline": arm_name(p, 0),
            "arms": [{"arm": arm_name(p, a)} for a in range(1, len(p.arms))], "seeds": p.seeds}


def check_plan(sweep_dir: Path, p: Plan, now: str | None = None) -> list[dict]:
    """The declared plan of a sweep folder is its ``sequential.json``'s: a sweep that starts there under another plan
    or question (``analysis.primary/delta/alpha``, ``analysis.sequential.*``, the arms, the seeds) would reuse the
    records and rewrite the decision while the records (and mlmlab.analysis) keep the old one -- a ConfigError naming
    the keys that differ (old -> new), before any job, unless ``analysis.sequential.replan=true``, which records the
    change. A folder without ``sequential.json`` (killed in its first round) declares the plan of its jobs' records
    (``analysis.*`` of their config). Returns the folder's recorded changes (``[{at, rounds_run, old, new}]``), this
    one appended."""
    import time

    path = Path(sweep_dir) / STATE
    try:
        before = json.loads(path.read_text())
        old = declared(before)
    except FileNotFoundError:
        before, found = {}, records_declared(sweep_dir)
        if found is None:
            return []
        old, path = found
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({e}); the folder's declared plan cannot be checked: move it away "
                          "or choose another hydra.sweep.dir") from None
    replans = list(before.get("replans") or [])
    new = declared(plan_state(p))
    changed = [k for k in new if k in old and old[k] != new[k]]
    if not changed:
        return replans
    if not p.question.sequential.replan:
        raise ConfigError(
            f"{path} declares another plan than this sweep's (" + ", ".join(
                f"{k}: {_show(old.get(k))} -> {_show(new[k])}" for k in changed)
            + "); its records were decided under the old one. Rerun with the folder's plan, choose another "
              "hydra.sweep.dir, or add analysis.sequential.replan=true to change the plan on the record")
    replans.append({"at": now or time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rounds_run": before.get("rounds_run"),
                    "old": {k: old.get(k) for k in changed}, "new": {k: new[k] for k in changed}})
    logging.getLogger(__name__).warning("analysis.sequential.replan=true: %s changes its declared plan (%s); recorded "
                                        "in its replans", path, ", ".join(changed))
    return replans


def records_declared(sweep_dir: Path) -> tuple[dict, Path] | None:
    """The sequential plan (keys as :func:`declared` names them, without the arms and seeds) that the first job record
    of a sweep folder declares in its config, with the record's path; None when no record declares one."""
    for rec in sorted(Path(sweep_dir).glob("*/results.json")):
        try:
            a = (json.loads(rec.read_text()).get("config") or {}).get("analysis") or {}
        except (OSError, ValueError, AttributeError):
            continue
        seq = dict(a.get("sequential") or {})
        if seq.get("max_seeds") is None:
            continue
        seq.setdefault("min_seeds", 2)
        return ({"analysis.primary": a.get("primary"), "analysis.delta": a.get("delta"), "analysis.alpha": a.get("alpha"),
                 **{f"analysis.sequential.{k}": v for k, v in seq.items() if k != "replan"}}, rec)
    return None


def _show(v) -> str:
    if isinstance(v, list) and len(v) > 6:
        return "[" + ", ".join(map(str, v[:6])) + ", ...]"
    return str(v)


def write_state(sweep_dir: Path, s: dict) -> None:
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = sweep_dir / f".{STATE}.tmp"
    tmp.write_text(dumps(s, indent=2))  # strict JSON: NaN as null
    os.replace(tmp, sweep_dir / STATE)


def read_record(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "results.json").read_text())


def describe(s: dict) -> str:
    """One line per arm: the decision, at which round and seed count, with the repeated confidence interval at that
    look, its t, the stagewise-ordering p and the repeated p (a state written before those existed: without them)."""
    lines = [f"sequential rule on {s['metric']} against {s['baseline']}: {s['rounds_run']} round(s) of "
             f"{len(s['looks'])} (looks at {s['looks']} seeds), "
             + ("stopped" if s["stopped"] else "not settled yet")]
    conf = f"{100 * (1 - s.get('alpha_per_arm', s.get('alpha', 0.05))):.3g}%"

    def p(v) -> str:
        return "-" if v is None else f"{v:.3g}"

    for a in s["arms"]:
        line = (f"  {a['arm']}: {a['verdict']} at round {a['round']} ({a['seeds']} seeds): {a['diff']:+.4f}, repeated "
                f"{conf} CI [{a['low']:+.4f}, {a['high']:+.4f}] (level {a['level']:.4f} at this look)")
        if "p_repeated" in a:
            line += (f", t = {a['t']:+.3f}" if a.get("t") is not None else "") + \
                    f", stagewise-ordering p = {p(a.get('p_stagewise'))}, repeated p = {p(a.get('p_repeated'))}"
        lines.append(line)
    return "\n".join(lines)


def run(p: Plan, launch, sweep_dir: Path, log=print, replans: Sequence[dict] | None = None) -> dict:
    """Run the plan round by round: ``launch(job overrides, first job number)`` runs a round's jobs and returns their
    output dirs (raising when one failed: a round with a missing record cannot be scored; re-running the sweep runs
    only that job again). Scores each round, writes ``<sweep_dir>/sequential.json``, stops when every arm is decided.
    ``replans``: what :func:`check_plan` returned (None: it is checked here, before the first job). Returns the last
    state."""
    if replans is None:
        replans = check_plan(sweep_dir, p)
    results: dict[int, tuple[int, stats.SequentialResult]] = {}
    values: dict[tuple[int, int], float] = {}
    active, number, s = list(range(1, len(p.arms))), 0, {}
    for k in range(len(p.looks)):
        jobs = p.round_jobs(k, active)
        dirs = launch([list(j.overrides) for j in jobs], number)
        number += len(jobs)
        for j, d in zip(jobs, dirs):
            values[j.arm, j.seed] = primary_value(read_record(d), p.question.primary, str(d))
        results.update({a: (k + 1, r) for a, r in decide(p, values, active).items()})
        active = [a for a in active if results[a][1].verdict == "continue"]
        s = state(p, k, results, number, replans)
        write_state(sweep_dir, s)
        log(describe(s))
        if not active:
            break
    return s
