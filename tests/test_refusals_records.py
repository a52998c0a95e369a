"""Issue 54 items 7 and 9: a folder that holds a checkpoint is never overwritten silently (a rerun without ``resume=``
is refused naming the exact ``resume=`` and ``overwrite=true``), and every record is strict JSON (null, never NaN)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_cfg, run_cli

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, to_container, validate

TINY = ["debug=fast", "logger=none", "downstream=none", "data.n_docs=200", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "trainer.log_every_n_steps=1"]


def _strict(text: str):
    def nan(c):
        raise ValueError(f"not strict JSON: bare {c}")

    return json.loads(text, parse_constant=nan)


def _killed_dir(d: Path, status: str | None = "failed", name: str = "checkpoints/last.ckpt") -> Path:
    """A job dir as a killed (``status=None``: no record at all) or failed job leaves it: a step-300 checkpoint."""
    ckpt = d / name
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 300, "state_dict": {"w": torch.ones(3)}}, ckpt)
    if status is not None:
        (d / "results.json").write_text(json.dumps({"status": status, "config": {}, "metrics": {}}))
    return ckpt


def _snap(p: Path) -> tuple[bytes, int]:
    return p.read_bytes(), p.stat().st_mtime_ns


def test_a_killed_job_rerun_without_resume_is_refused_and_its_checkpoint_kept(cfg_factory, tmp_path):
    run = tmp_path / "run"
    ckpt = _killed_dir(run)
    before, record = _snap(ckpt), (run / "results.json").read_bytes()
    with pytest.raises(ConfigError) as e:
        train(cfg_factory(*TINY, output_dir=run))
    msg = str(e.value)
    assert "\n" not in msg and f"resume={run}," in msg and "overwrite=true" in msg, msg
    assert "global step 300" in msg and "results.json: failed" in msg
    assert _snap(ckpt) == before  # not a byte or an mtime changed
    assert (run / "results.json").read_bytes() == record  # the earlier run's record is not replaced by the refusal
    assert not (run / ".running.json").exists() and not (run / "train_log.jsonl").exists()


def test_killed_before_any_record_and_other_ckpt_names_are_refused_too(cfg_factory, tmp_path):
    run = tmp_path / "run"
    _killed_dir(run, status=None)  # SIGKILL: a checkpoint, no results.json
    with pytest.raises(ConfigError, match=r"results.json: none\); continue it with resume="):
        train(cfg_factory(*TINY, output_dir=run))
    other = tmp_path / "other"
    ckpt = _killed_dir(other, name="checkpoints/step=300.ckpt")  # any *.ckpt: the exact file to resume
    with pytest.raises(ConfigError, match=rf"resume={ckpt}, or start again"):
        train(cfg_factory(*TINY, output_dir=other))
    from mlmlab.checkpoint import check_not_overwriting

    check_not_overwriting(tmp_path / "fresh", None, False)  # a fresh (or missing) dir: nothing to refuse
    check_not_overwriting(run, str(run), False)  # resume= and overwrite=true: nothing to refuse
    check_not_overwriting(run, None, True)


def test_a_multirun_job_or_a_changed_skip_completed_job_warns_with_the_same_line(tmp_path, caplog):
    """Not refused, but never silent: a multirun's replay reruns its failed and missing jobs in their dirs (no one
    resume= fits every job), and skip_completed reruns a finished job whose config changed."""
    from mlmlab.checkpoint import check_not_overwriting

    failed, done = tmp_path / "failed", tmp_path / "done"
    _killed_dir(failed)
    _killed_dir(done, status="ok")
    with caplog.at_level("WARNING", logger="mlmlab.checkpoint"):
        check_not_overwriting(failed, None, False, multirun=True)
        check_not_overwriting(done, None, False, skip_completed=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and f"resume={failed}," in lines[0] and "a multirun job: running the job again" in lines[0]
    assert f"resume={done}," in lines[1] and "results.json: ok" in lines[1]
    with pytest.raises(ConfigError):  # a failed record is refused whatever skip_completed says (single run)
        check_not_overwriting(failed, None, False, skip_completed=True)


def test_a_single_run_into_a_finished_dir_is_refused_and_skip_completed_returns_its_record(cfg_factory, tmp_path):
    run = tmp_path / "run"
    cfg = cfg_factory(*TINY, output_dir=run)
    ckpt = _killed_dir(run)
    (run / "results.json").write_text(json.dumps({"status": "ok", "config": to_container(cfg),
                                                  "metrics": {"downstream/score": None, "val/mlm_loss_r15": 5.0}}))
    before = _snap(ckpt)
    with pytest.raises(ConfigError, match=r"a finished run \(results.json: ok; skip_completed=true keeps it"):
        train(cfg)
    m = train(cfg_factory(*TINY, "skip_completed=true", output_dir=run))  # today's behaviour: the record, not a run
    assert math.isnan(m["downstream/score"]) and m["val/mlm_loss_r15"] == 5.0  # null read back as missing (NaN)
    assert _snap(ckpt) == before


def test_overwrite_with_resume_is_a_config_error(cfg_factory, tmp_path):
    run = tmp_path / "run"
    _killed_dir(run)
    with pytest.raises(ConfigError, match=r"overwrite=true and resume=.* contradict"):
        validate(cfg_factory(*TINY, "overwrite=true", f"resume={run}"))
    with pytest.raises(Exception, match="overwrite"):  # typed: a bool
        cfg_factory(*TINY, "overwrite=maybe")


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_the_refusal_is_one_line_on_the_command_line(tmp_path, cache_dir):
    run = tmp_path / "run"
    ckpt = _killed_dir(run)
    before = _snap(ckpt)
    p = run_cli([*TINY, f"hydra.run.dir={run}"], cache_dir, full_error=False)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith(f"error: paths.output_dir={run} already holds a checkpoint"), p.stderr[-3000:]
    assert f"resume={run}," in lines[-1] and "overwrite=true" in lines[-1]
    assert _snap(ckpt) == before


@pytest.fixture(scope="module")
def overwritten(tmp_path_factory, cache_dir) -> Path:
    """A killed job's dir (step-300 checkpoint, failed record) run again with overwrite=true: a downstream=none job."""
    run = tmp_path_factory.mktemp("overwrite") / "run"
    _killed_dir(run)
    train(make_cfg([*TINY, "overwrite=true"], run, cache_dir))
    return run


def test_overwrite_true_starts_again_and_replaces_the_checkpoint(overwritten):
    r = json.loads((overwritten / "results.json").read_text())
    assert r["status"] == "ok" and r["config"]["overwrite"] is True and r["metrics"]["train/steps"] == 2
    assert torch.load(overwritten / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_the_refusals_resume_line_continues_the_run(overwritten, tmp_path, cache_dir):
    run = tmp_path / "run"
    shutil.copytree(overwritten, run)
    (run / "results.json").unlink()  # as if killed after its checkpoint
    with pytest.raises(ConfigError) as e:
        train(make_cfg(TINY, run, cache_dir))
    resume = next(w for w in str(e.value).split() if w.startswith("resume=")).rstrip(",")
    m = train(make_cfg([*TINY, resume], run, cache_dir))  # the override exactly as the message gives it
    r = json.loads((run / "results.json").read_text())
    assert r["status"] == "ok" and r["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert m["train/steps"] == 2


def test_a_downstream_none_record_is_strict_json(overwritten):
    text = (overwritten / "results.json").read_text()
    r = _strict(text)  # a bare NaN raises here
    assert "downstream/score" in r["metrics"] and r["metrics"]["downstream/score"] is None
    from mlmlab.runs import load_runs

    df = load_runs(overwritten)  # null read as missing, as NaN was
    assert df["status"].tolist() == ["ok"] and math.isnan(float(df["downstream/score"].iloc[0]))


def test_every_record_write_is_strict_json(tmp_path):
    import numpy as np

    from mlmlab.results import RunRecord, dumps

    rec = RunRecord(tmp_path, {"mask": {"rate": float("inf")}})
    rec.set(status="ok", metrics={"a": float("nan"), "b": np.float32("nan"), "c": 1.5, "d": [float("-inf"), 2.0]})
    r = _strict(rec.write().read_text())
    assert r["metrics"] == {"a": None, "b": None, "c": 1.5, "d": [None, 2.0]} and r["config"]["mask"]["rate"] is None
    rec2 = RunRecord(tmp_path / "f", {})
    rec2.set(metrics={"x": float("nan")})
    rec2.fail(RuntimeError("boom"))
    assert _strict(rec2.write().read_text())["metrics"] == {"x": None}  # a failed record too
    assert _strict(dumps({"s": (float("nan"), 1)})) == {"s": [None, 1]}


def test_overwrite_is_never_a_protocol_difference():
    """A job run again with overwrite=true (or a record from before the key) compares with the others like a
    resume= or skip_completed one: the key says where a job ran again, not how it was measured."""
    import pandas as pd

    from mlmlab.tables import same_protocol

    df = pd.DataFrame({"mask.rate": [0.15, 0.15, 0.4, 0.4], "seed": [0, 1, 0, 1], "status": ["ok"] * 4,
                       "downstream/score": [0.5, 0.6, 0.55, 0.65], "overwrite": [False, None, True, False]})
    same_protocol(df, "mask.rate", ["downstream/score"])  # no ValueError
