"""Sweeps that cannot be run twice or re-planned after the fact (issue 54, items 2 and 3): a sweep folder's
``sequential.json`` declares its plan (another one only with ``analysis.sequential.replan=true``, recorded there),
and a live sweep or job folder is locked (mlmlab.sweep.lock_folder: flock, released by the kernel on exit)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_cli

from mlmlab import rounds
from mlmlab.errors import ConfigError
from mlmlab.stats import Question
from mlmlab.sweep import JOB_LOCK, SWEEP_LOCK, FolderBusy, lock_folder, unlock_folder

JOB = ["-m", "debug=fast", "downstream=none", "logger=none"]
SEQ = ["mask.rate=0.15,0.4", "analysis.primary=budget/tokens", "analysis.sequential.round=1",
       "analysis.sequential.min_seeds=2"]


def q(**seq):
    return Question(primary="downstream/score", delta=0.01, sequential={"round": 2, "min_seeds": 2, **seq})


def fake_launch(tmp_path, launched):
    """Jobs whose records carry a large planted effect of mask.rate=0.4 on the primary."""
    rng = np.random.default_rng(0)

    def launch(batch, first):
        dirs = []
        for i, job in enumerate(batch, start=first):
            d = tmp_path / str(i)
            d.mkdir(exist_ok=True)
            value = 0.8 + 0.1 * ("mask.rate=0.4" in job) + rng.normal(0, 0.001)
            (d / "results.json").write_text(json.dumps({"status": "ok", "metrics": {"downstream/score": value}}))
            launched.append(tuple(job))
            dirs.append(d)
        return dirs
    return launch


def test_a_finished_sequential_folder_refuses_another_plan_unless_replan(tmp_path):
    grid = {"mask.rate": ["0.15", "0.4"]}
    first = rounds.run(rounds.plan([], dict(grid), q(max_seeds=4)), fake_launch(tmp_path, []), tmp_path,
                       log=lambda m: None)
    assert first["stopped"] and "replans" not in first
    launched = []
    with pytest.raises(ConfigError, match=r"analysis\.sequential\.max_seeds: 4 -> 8.*replan=true") as e:
        rounds.run(rounds.plan([], dict(grid), q(max_seeds=8)), fake_launch(tmp_path, launched), tmp_path,
                   log=lambda m: None)
    assert "\n" not in str(e.value) and not launched  # one line, before any job
    assert json.loads((tmp_path / rounds.STATE).read_text()) == first  # the folder's decision is untouched
    # the same plan again (replan is no part of it): no change, nothing recorded
    assert rounds.check_plan(tmp_path, rounds.plan([], dict(grid), q(max_seeds=4, replan=True))) == []
    s = rounds.run(rounds.plan([], dict(grid), q(max_seeds=8, replan=True)), fake_launch(tmp_path, launched),
                   tmp_path, log=lambda m: None)
    assert launched and s["plan"]["max_seeds"] == 8 and "replan" not in s["plan"]
    (r,) = s["replans"]
    assert r["old"]["analysis.sequential.max_seeds"] == 4 and r["new"]["analysis.sequential.max_seeds"] == 8
    assert r["rounds_run"] == first["rounds_run"] and r["at"]
    # the new plan is now the folder's: rerunning it needs no replan, and the change stays on the record
    again = rounds.run(rounds.plan([], dict(grid), q(max_seeds=8)), fake_launch(tmp_path, []), tmp_path,
                       log=lambda m: None)
    assert again["replans"] == s["replans"]


@pytest.mark.parametrize("change, key", [
    ({"sequential": {"max_seeds": 4, "round": 2, "min_seeds": 2, "spending": "obrien_fleming"}},
     "analysis.sequential.spending"),
    ({"delta": 0.02}, "analysis.delta"),
    ({"primary": "downstream/other"}, "analysis.primary"),
])
def test_every_key_of_the_plan_is_checked(tmp_path, change, key):
    grid = {"mask.rate": ["0.15", "0.4"]}
    rounds.run(rounds.plan([], dict(grid), q(max_seeds=4)), fake_launch(tmp_path, []), tmp_path, log=lambda m: None)
    other = Question(**{"primary": "downstream/score", "delta": 0.01,
                        "sequential": {"max_seeds": 4, "round": 2, "min_seeds": 2}, **change})
    with pytest.raises(ConfigError, match=key):
        rounds.check_plan(tmp_path, rounds.plan([], dict(grid), other))
    with pytest.raises(ConfigError, match="arms"):  # another grid in the folder: another question
        rounds.check_plan(tmp_path, rounds.plan([], {"mask.rate": ["0.15", "0.5"]}, q(max_seeds=4)))


def test_a_folder_killed_before_its_first_state_declares_its_records_plan(tmp_path):
    (tmp_path / "0").mkdir()
    analysis = {"primary": "downstream/score", "delta": 0.01, "alpha": 0.05,
                "sequential": {"max_seeds": 4, "round": 2, "first": None, "spending": "pocock", "min_seeds": 2}}
    (tmp_path / "0" / "results.json").write_text(json.dumps({"status": "ok", "config": {"analysis": analysis}}))
    grid = {"mask.rate": ["0.15", "0.4"]}
    assert rounds.check_plan(tmp_path, rounds.plan([], dict(grid), q(max_seeds=4))) == []
    with pytest.raises(ConfigError, match=r"0/results.json .*analysis\.sequential\.max_seeds: 4 -> 6"):
        rounds.check_plan(tmp_path, rounds.plan([], dict(grid), q(max_seeds=6)))
    (r,) = rounds.check_plan(tmp_path, rounds.plan([], dict(grid), q(max_seeds=6, replan=True)))
    assert r["old"] == {"analysis.sequential.max_seeds": 4} and r["rounds_run"] is None


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_the_cli_refuses_a_sequential_rerun_under_another_plan(tmp_path, cache_dir):
    """The folder's sequential.json (written here as a finished sweep of the same grid would) against a rerun with
    another max_seeds: one line naming the key, exit 2, no job run and the state untouched."""
    sweep = tmp_path / "seq"
    p = rounds.plan(["debug=fast", "downstream=none", "logger=none", "analysis.primary=budget/tokens",
                     "analysis.sequential.round=1", "analysis.sequential.min_seeds=2"],
                    {"mask.rate": ["0.15", "0.4"]},
                    Question(primary="budget/tokens", sequential={"max_seeds": 2, "round": 1, "min_seeds": 2}))
    res = {a: (1, r) for a, r in rounds.decide(p, {(a, s): 20480.0 for a in (0, 1) for s in p.seeds}, [1]).items()}
    state = rounds.state(p, 0, res, 4)
    rounds.write_state(sweep, state)
    before = (sweep / rounds.STATE).read_text()
    out = run_cli([*JOB, *SEQ, "analysis.sequential.max_seeds=3", f"hydra.sweep.dir={sweep}"], cache_dir,
                  full_error=False)
    assert out.returncode == 2, out.stderr[-2000:]
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "analysis.sequential.max_seeds: 2 -> 3" in line[0] and "replan=true" in line[0]
    assert not list(sweep.rglob("results.json")) and (sweep / rounds.STATE).read_text() == before


@pytest.mark.slow
def test_a_real_sequential_sweep_replanned_records_the_change(tmp_path, cache_dir):
    """Real jobs: a finished 2-seed sweep re-run with max_seeds=3 is refused; with replan=true it runs the third seed
    alone (the others are skipped as complete) and sequential.json records the change."""
    sweep = tmp_path / "seq"
    args = [*JOB, *SEQ, f"hydra.sweep.dir={sweep}"]
    assert run_cli([*args, "analysis.sequential.max_seeds=2"], cache_dir).returncode == 0
    assert len(list(sweep.rglob("results.json"))) == 4
    out = run_cli([*args, "analysis.sequential.max_seeds=3"], cache_dir, full_error=False)
    assert out.returncode == 2 and "analysis.sequential.max_seeds: 2 -> 3" in out.stderr
    out = run_cli([*args, "analysis.sequential.max_seeds=3", "analysis.sequential.replan=true"], cache_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list(sweep.rglob("results.json"))) == 6  # same job dirs: replan is not in the jobs' identity
    s = json.loads((sweep / rounds.STATE).read_text())
    assert s["plan"]["max_seeds"] == 3 and s["replans"][0]["old"]["analysis.sequential.max_seeds"] == 2


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_live_sweep_folder_refuses_a_second_multirun(tmp_path, cache_dir):
    """The live multirun is simulated by this test process holding the folder's lock: the CLI names its pid and host,
    exits non-zero and runs no job."""
    sweep = tmp_path / "busy"
    assert lock_folder(sweep, SWEEP_LOCK, "multirun")
    try:
        out = run_cli([*JOB, "seed=0", f"hydra.sweep.dir={sweep}"], cache_dir, full_error=False)
    finally:
        unlock_folder(sweep, SWEEP_LOCK)
    assert out.returncode != 0
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and f"pid {os.getpid()} on {socket.gethostname()}" in line[0], out.stderr[-2000:]
    assert not list(sweep.rglob("results.json")) and not list(sweep.rglob("train_log.jsonl"))


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_live_job_folder_refuses_a_second_run(tmp_path, cache_dir):
    out_dir = tmp_path / "job"
    assert lock_folder(out_dir, JOB_LOCK, "job")
    try:
        out = run_cli(["debug=fast", "downstream=none", "logger=none", f"paths.output_dir={out_dir}"], cache_dir,
                      full_error=False)
    finally:
        unlock_folder(out_dir, JOB_LOCK)
    assert out.returncode != 0 and f"pid {os.getpid()}" in out.stderr, out.stderr[-2000:]
    assert not (out_dir / "results.json").exists() and not (out_dir / "train_log.jsonl").exists()


def test_a_lock_dies_with_its_process(tmp_path):
    """A killed holder leaves no stale lock (the kernel drops a flock with its process); this process's own lock is
    re-entrant (held once) and refuses nobody but other processes."""
    code = ("import sys, time; from mlmlab.sweep import lock_folder; lock_folder(sys.argv[1], '.sweep.lock', 'x'); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=f"pid {holder.pid} on {socket.gethostname()}"):
            lock_folder(tmp_path, SWEEP_LOCK, "multirun")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_folder(tmp_path, SWEEP_LOCK, "multirun")
    assert not lock_folder(tmp_path, SWEEP_LOCK, "multirun")  # already ours
    unlock_folder(tmp_path, SWEEP_LOCK)


@pytest.mark.parametrize("overrides,message", [
    (["analysis.primary=downstream/sst3@500/acc"], "reads task 'sst3', which this job does not fine-tune"),
    (["analysis.primary=downstream/builtin_sentiment@64/acc", "downstream.max_train_examples=[16,32]"],
     "reads 64 labels, a budget this job does not run; allowed: 16, 32"),
    (["analysis.primary=downstream/score", "analysis.family=[val/mlm_loss_r15]", "objective=electra"],
     "analysis.family=val/mlm_loss_r15 is the MLM's fixed-mask loss, which objective=electra does not log"),
])
def test_a_declared_metric_the_job_never_logs_is_refused_at_validation(cfg_factory, overrides, message):
    """Issue 54 item 13: known before any job (a sweep validates every job first), not after round 1."""
    from mlmlab.config import ConfigError, validate

    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(cfg_factory("downstream.tasks=[builtin_sentiment]", *overrides))
    validate(cfg_factory("downstream.tasks=[builtin_sentiment]", "downstream.max_train_examples=[16,32]",
                         "analysis.primary=downstream/builtin_sentiment@32/acc", "analysis.family=[val/mlm_loss_r15]"))
