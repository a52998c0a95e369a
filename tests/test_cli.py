"""The README's commands, short variants: a single CLI run and real Hydra multiruns into tmp dirs."""

import json
import re

import pytest
from conftest import ROOT, run_cli

from mlmlab.analysis import load_runs, read_wandb_offline, wandb_run_dirs


def test_readme_shows_the_contract_commands():
    readme = (ROOT / "README.md").read_text()
    for cmd in ('pip install -e ".[dev]"', "python -m mlmlab.train", "pytest",
                "python -m mlmlab.train mask.rate=0.1,0.2,0.4 seed=0,1 -m"):
        assert cmd in readme, cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in ci and re.search(r"^\s*(python -m )?pytest", ci, re.M)


def test_single_run_from_the_cli(tmp_path, cache_dir):
    out = tmp_path / "single"
    p = run_cli(["debug=fast", f"hydra.run.dir={out}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "ok" and r["overrides"] == ["debug=fast"]
    assert (out / ".hydra" / "config.yaml").exists()


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_multirun_two_jobs(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "debug=fast", "mask.rate=0.1,0.3", "downstream.tasks=[builtin_sentiment]",
                 f"hydra.sweep.dir={sweep}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    df = load_runs(sweep)
    assert sorted(df["mask.rate"]) == [0.1, 0.3]
    by_rate = df.set_index("mask.rate")["train/selected_frac"]
    assert abs(by_rate[0.1] - 0.1) < 0.03 and abs(by_rate[0.3] - 0.3) < 0.03  # realized corruption telemetry
    groups = set()
    for job in df["run_dir"]:
        (w,) = wandb_run_dirs(job)
        info = read_wandb_offline(w)
        assert info["exit_code"] == 0
        groups.add(info["run"]["group"])
        assert info["run"]["name"].startswith("debug=fast")
    assert len(groups) == 1 and groups.pop().startswith("sweep_")  # one W&B group per sweep


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_failing_job_does_not_stop_the_sweep(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    # a job that passes validation and fails while training (lr 1e30: a NaN loss at step 2)
    p = run_cli(["-m", "debug=fast", "downstream=none", "trainer.max_steps=3", "optim.lr=1e30,1e-3",
                 f"hydra.sweep.dir={sweep}"], cache_dir, full_error=False)
    assert p.returncode != 0  # the sweep reports the failure ...
    assert "non-finite loss at step" in p.stderr
    df = load_runs(sweep, include_failed=True).set_index("optim.lr")
    assert df.loc[1e30, "status"] == "failed" and df.loc[1e-3, "status"] == "ok"  # ... after running the other job


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_long_and_path_overrides_give_valid_job_dirs(tmp_path, cache_dir):
    """Job folders are one path segment, and long override lists are cut + hashed instead of crashing the sweep."""
    sweep = tmp_path / "sweep"
    long = [f"logger.wandb.tags=[{','.join('t' + str(i) * 12 for i in range(12))}]", "trainer.log_every_n_steps=1",
            f"paths.cache_dir={cache_dir}", "trainer.val_check_interval=2", "trainer.max_steps=2"]
    p = run_cli(["debug=fast", "downstream=none", *long, "mask.rate=0.1,0.2", f"hydra.sweep.dir={sweep}", "-m"],
                cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d.name for d in sweep.iterdir() if d.is_dir())
    assert len(jobs) == 2 and all(len(j) <= 120 and "~" in j for j in jobs) and jobs[0] != jobs[1]
    assert all((sweep / j / "results.json").exists() for j in jobs)


def test_a_config_error_is_one_line_without_a_traceback(tmp_path, cache_dir):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(MLMLAB_CACHE_DIR=str(cache_dir), WANDB_MODE="offline")
    p = subprocess.run([sys.executable, "-m", "mlmlab.train", "debug=fast", "mask.rate=1.5",
                        f"paths.output_dir={tmp_path}/run"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "Set the environment variable HYDRA_FULL_ERROR" not in p.stderr
    line = [x for x in p.stderr.splitlines() if x.startswith("error: ")]
    assert len(line) == 1 and "mask.rate=1.5 must be in the open interval (0, 1)" in line[0]
    assert f"(record: {tmp_path}/run/results.json)" in line[0]


def test_a_bad_arm_of_a_grid_fails_before_any_job_runs(tmp_path, cache_dir):
    """The whole grid is composed and validated first: the bad arm is named, no job dir is written."""
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "debug=fast", "mask.rate=0.1,1.5,-1", "seed=0,1", f"hydra.sweep.dir={sweep}"], cache_dir,
                full_error=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr  # one line
    # every bad arm is named (issue 54 item 15), each error once with how many jobs share it
    assert "sweep job [debug=fast mask.rate=1.5 seed=0] and 1 more: mask.rate=1.5 must be in the open interval (0, 1)" \
        in p.stderr
    assert "sweep job [debug=fast mask.rate=-1 seed=0] and 1 more: mask.rate=-1" in p.stderr
    assert "no job of the 6 has run" in p.stderr and not sweep.exists()
