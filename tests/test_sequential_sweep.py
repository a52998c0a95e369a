"""Sweeps that stop when the question is settled (analysis.sequential; mlmlab/rounds.py and its Hydra sweeper,
hydra_plugins/mlmlab_sweeper): the rounds, the stop, the resume, and a multirun that never redoes finished work."""

import json

import numpy as np
import pytest
from conftest import run_cli

from mlmlab import rounds
from mlmlab.errors import ConfigError
from mlmlab.stats import Question

Q = Question(primary="downstream/score", delta=0.01, sequential={"max_seeds": 6, "round": 2, "min_seeds": 2})


def fake_launch(tmp_path, value, launched):
    """A launcher that writes each job's record with ``value(arm overrides, seed)`` as its primary metric."""
    def launch(batch, first):
        dirs = []
        for i, job in enumerate(batch, start=first):
            d = tmp_path / str(i)
            d.mkdir(exist_ok=True)
            seed = int(next(o for o in job if o.startswith("seed=")).split("=")[1])
            (d / "results.json").write_text(json.dumps({"status": "ok",
                                                        "metrics": {"downstream/score": value(job, seed)}}))
            launched.append(tuple(job))
            dirs.append(d)
        return dirs
    return launch


def test_plan_rounds_pair_the_arms_of_each_seed():
    p = rounds.plan(["debug=fast"], {"mask.rate": ["0.15", "0.4"]}, Q)
    assert p.seeds == [0, 1, 2, 3, 4, 5] and p.looks == (2, 4, 6)
    assert [j.overrides for j in p.round_jobs(1, [1])] == [
        ("debug=fast", "mask.rate=0.15", "seed=2"), ("debug=fast", "mask.rate=0.4", "seed=2"),
        ("debug=fast", "mask.rate=0.15", "seed=3"), ("debug=fast", "mask.rate=0.4", "seed=3")]
    assert len(p.all_jobs()) == 12
    assert rounds.plan([], {"seed": ["5", "1", "2", "3", "4", "0"], "mask.rate": ["0.15", "0.4"]}, Q).seeds[:2] == [5, 1]


@pytest.mark.parametrize("fixed, swept, q, msg", [
    ([], {"mask.rate": ["0.15", "0.4"]}, Question(sequential={"max_seeds": 4}), "needs analysis.primary"),
    (["seed=0"], {"mask.rate": ["0.15", "0.4"]}, Q, "seed is fixed"),
    ([], {"seed": ["0", "1", "2"], "mask.rate": ["0.15", "0.4"]}, Q, "max_seeds=6"),
    ([], {"seed": [str(s) for s in range(6)]}, Q, "sweeps nothing besides seed"),
    ([], {"mask.rate": ["0.15", "0.4"], "analysis.delta": ["0.01", "0.02"]}, Q, "analysis.* is swept"),
])
def test_plan_rejects_what_the_rule_cannot_run(fixed, swept, q, msg):
    with pytest.raises(ConfigError, match=msg):
        rounds.plan(fixed, swept, q)


def test_large_effect_stops_at_the_first_round(tmp_path):
    rng = np.random.default_rng(0)
    launched = []
    p = rounds.plan([], {"mask.rate": ["0.15", "0.4"]}, Q)
    s = rounds.run(p, fake_launch(tmp_path, lambda job, seed: 0.8 + 0.1 * ("mask.rate=0.4" in job)
                                  + rng.normal(0, 0.001), launched), tmp_path, log=lambda m: None)
    assert len(launched) == 4 and s["rounds_run"] == 1 and s["stopped"]
    assert s["arms"][0]["verdict"] == "better" and s["arms"][0]["round"] == 1
    assert json.loads((tmp_path / rounds.STATE).read_text()) == s


def test_null_never_calls_a_winner_and_a_decided_arm_runs_no_more_seeds(tmp_path):
    """Three arms: 0.4 equal to the baseline to the last digit (never a winner: equivalent within the margin), 0.3 a
    large loss (decided at round 1, then it runs no more seeds), 0.2 noise of the margin's size (runs every round)."""
    rng = np.random.default_rng(1)
    launched = []

    def value(job, seed):
        if "mask.rate=0.3" in job:
            return 0.5 + rng.normal(0, 0.0001)
        if "mask.rate=0.2" in job:
            return 0.8 + rng.normal(0, 0.05)
        return 0.8 + 0.001 * seed

    p = rounds.plan([], {"mask.rate": ["0.15", "0.4", "0.3", "0.2"]}, Q)
    s = rounds.run(p, fake_launch(tmp_path, value, launched), tmp_path, log=lambda m: None)
    by = {a["arm"]: a for a in s["arms"]}
    assert by["mask.rate=0.4"]["verdict"] == "equivalent"
    assert by["mask.rate=0.3"]["verdict"] == "worse" and by["mask.rate=0.3"]["round"] == 1
    assert by["mask.rate=0.2"]["verdict"] not in ("better", "worse")
    assert sum("mask.rate=0.3" in j for j in launched) == 2  # its round-1 seeds only
    assert s["alpha_per_arm"] == pytest.approx(0.05 / 3)


def test_missing_primary_metric_is_named(tmp_path):
    p = rounds.plan([], {"mask.rate": ["0.15", "0.4"]}, Question(primary="downstream/nope/acc",
                                                                  sequential={"max_seeds": 2}))
    with pytest.raises(ConfigError, match="downstream/nope/acc"):
        rounds.run(p, fake_launch(tmp_path, lambda j, s: 0.5, []), tmp_path, log=lambda m: None)


# ------------------------------------------------------------------------------------------------ real sweeps

JOB = ["-m", "debug=fast", "downstream.tasks=[builtin_sentiment]", "logger=none"]



def records(sweep):
    return sorted(sweep.glob("*/results.json"))


@pytest.mark.slow
def test_sequential_sweep_stops_by_itself_on_a_planted_effect(tmp_path, cache_dir):
    """Real jobs through the core-splitting launcher: 20 steps against 10 doubles the tokens seen (the primary here, a
    planted effect with no noise); the rule decides at the first look, so the second round's seeds never run."""
    sweep = tmp_path / "planted"
    p = run_cli([*JOB, "trainer.max_steps=10,20", "analysis.primary=budget/tokens", "analysis.sequential.max_seeds=4",
                 "analysis.sequential.min_seeds=2", "hydra/launcher=cores", f"hydra.sweep.dir={sweep}"],
                cache_dir)  # a round's 2 jobs at once
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(records(sweep)) == 4  # 2 arms x the first round's 2 seeds
    s = json.loads((sweep / "summary.json").read_text())["sequential"]
    assert s["stopped"] and s["rounds_run"] == 1
    assert s["arms"][0]["arm"] == "trainer.max_steps=20" and s["arms"][0]["verdict"] == "better"


@pytest.mark.slow
def test_sequential_sweep_without_an_effect_runs_every_round_and_resumes(tmp_path, cache_dir):
    """Real jobs, no effect on the primary (tokens seen do not depend on the mask rate) and no margin declared: no
    winner is called; all rounds run. One record lost: the rerun runs that job alone and ends where it did."""
    sweep = tmp_path / "null"
    args = [*JOB, "mask.rate=0.15,0.4", "analysis.primary=budget/tokens", "analysis.sequential.max_seeds=3",
            "analysis.sequential.round=1", "analysis.sequential.min_seeds=2",
            f"hydra.sweep.dir={sweep}"]  # looks at 2 and 3 seeds
    p = run_cli(args, cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    first = json.loads((sweep / "sequential.json").read_text())
    assert first["rounds_run"] == 2 and first["arms"][0]["verdict"] == "inconclusive" and first["jobs_run"] == 6
    recs = records(sweep)
    assert len(recs) == 6
    before = {r: r.stat().st_mtime_ns for r in recs}
    lost = recs[-1]
    lost.unlink()
    p = run_cli(args, cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert out.count("is complete; not running this job again") == 5
    assert all(r.stat().st_mtime_ns == t for r, t in before.items() if r != lost) and lost.exists()
    assert json.loads((sweep / "sequential.json").read_text())["arms"] == first["arms"]


def test_sequential_sweep_is_validated_before_any_job(tmp_path, cache_dir):
    sweep = tmp_path / "bad"
    p = run_cli([*JOB, "mask.rate=0.15,0.4", "seed=0,1,2", "analysis.primary=budget/tokens",
                 "analysis.sequential.max_seeds=4", f"hydra.sweep.dir={sweep}"], cache_dir, full_error=False)
    assert p.returncode != 0 and "analysis.sequential.max_seeds=4" in p.stderr
    assert not list(sweep.rglob("results.json"))


@pytest.mark.slow
def test_rerunning_a_plain_multirun_skips_finished_jobs_unless_forced(tmp_path, cache_dir):
    sweep = tmp_path / "plain"
    args = [*JOB, "seed=0", f"hydra.sweep.dir={sweep}"]
    assert run_cli(args, cache_dir).returncode == 0
    stamp = {r: r.stat().st_mtime_ns for r in records(sweep)}
    assert len(stamp) == 1
    p = run_cli(args, cache_dir)
    assert p.returncode == 0 and (p.stdout + p.stderr).count("is complete; not running this job again") == 1
    assert {r: r.stat().st_mtime_ns for r in records(sweep)} == stamp
    p = run_cli([*args, "skip_completed=false"], cache_dir)  # forced: both run again, in the same dirs
    assert p.returncode == 0 and "is complete" not in p.stdout + p.stderr
    assert all(r.stat().st_mtime_ns != t for r, t in stamp.items())
