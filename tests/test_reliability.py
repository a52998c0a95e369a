"""Fault tests: exact resume after SIGKILL / SIGTERM, atomic records, idempotent sweeps, corrupt caches,
non-finite losses and gradients, a failing W&B, bad data. Each would fail without the mechanism it proves."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate

# 200 built-in documents -> 155 training blocks = 9 batches of 16 per epoch: 14 steps cross an epoch boundary
SMALL = ["debug=fast", "logger=none", "downstream=none", "data.n_docs=200", "trainer.max_steps=14",
         "trainer.log_every_n_steps=1", "trainer.val_check_interval=5"]


def _cli(args, cache, env=None, timeout=300):
    e = {**os.environ, "MLMLAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "mlmlab.train", *args], cwd=ROOT, env=e, capture_output=True,
                          text=True, timeout=timeout)


def _params(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def _log(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("full") / "run"
    p = _cli([*SMALL, f"hydra.run.dir={out}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_sigkill_mid_epoch_then_resume_is_bitwise_exact(uninterrupted, cache_dir, tmp_path):
    """Checkpoint every 4 steps, SIGKILL right after step 9 (last checkpoint: step 8, one batch before the end of
    epoch 0), resume: the same parameters bit for bit and the same per-step loss as the uninterrupted run."""
    run = tmp_path / "run"
    args = [*SMALL, "trainer.checkpoint_every_n_steps=4", f"hydra.run.dir={run}"]
    p = _cli(args, cache_dir, env={"MLMLAB_FAULT_KILL_AT_STEP": "9"})
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    assert not (run / "results.json").exists()  # killed: no record at all, never a partial one
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 8 and ckpt["mlmlab_resume"]["sampler"] == {"epoch": 0, "start": 8}
    assert [r["step"] for r in _log(run)] == list(range(1, 10))  # the killed run logged step 9, lost on resume

    p = _cli([*args, f"resume={run}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    full, resumed = _params(uninterrupted), _params(run)
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[k], resumed[k]) for k in full), "parameters differ after resume"
    assert _log(run) == _log(uninterrupted)  # steps 1-8 from before the kill, 9-14 after the resume: identical
    r = json.loads((run / "results.json").read_text())
    assert r["status"] == "ok" and r["resumed_from"].endswith("last.ckpt") and r["metrics"]["train/steps"] == 14
    ref = json.loads((uninterrupted / "results.json").read_text())
    assert r["metrics"]["val/mlm_loss_r15"] == ref["metrics"]["val/mlm_loss_r15"]


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_sigterm_checkpoints_then_resume_is_bitwise_exact(uninterrupted, cache_dir, tmp_path):
    """No periodic checkpoints: SIGTERM (preemption) after step 9 -- the end of epoch 0 -- saves one, the job exits
    non-zero with a failed record saying how to resume, and resuming ends where the uninterrupted run ends."""
    run = tmp_path / "run"
    args = [*SMALL, f"hydra.run.dir={run}"]
    p = _cli(args, cache_dir, env={"MLMLAB_FAULT_SIGTERM_AT_STEP": "9"})
    assert p.returncode == 1, p.stderr[-3000:]
    r = json.loads((run / "results.json").read_text())
    assert r["status"] == "failed" and r["error"]["type"] == "Preempted"
    assert "SIGTERM at step 9" in r["error"]["message"] and f"resume={run}" in r["error"]["message"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 9

    p = _cli([*args, f"resume={run / 'checkpoints' / 'last.ckpt'}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    full, resumed = _params(uninterrupted), _params(run)
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert _log(run) == _log(uninterrupted)
    assert json.loads((run / "results.json").read_text())["status"] == "ok"  # the ok record replaces the failed one


def test_resume_errors_name_the_key_before_any_work(cfg_factory, tmp_path, uninterrupted):
    with pytest.raises(ConfigError, match=r"resume='/does/not/exist'.*does not exist"):
        validate(cfg_factory("resume=/does/not/exist"))
    with pytest.raises(ConfigError, match=r"trainer.checkpoint_every_n_steps=0 must be >= 1 or null"):
        validate(cfg_factory("trainer.checkpoint_every_n_steps=0"))
    with pytest.raises(ConfigError, match=r"trainer.nonfinite='ignore' is not known; allowed: error, skip, off"):
        validate(cfg_factory("trainer.nonfinite=ignore"))
    # another run's checkpoint (a different mask rate): refused, naming what differs
    cfg = cfg_factory(*SMALL[1:], "mask.rate=0.3", f"resume={uninterrupted}", output_dir=tmp_path / "other")
    with pytest.raises(ConfigError, match=r"different config \(mask.rate: 0.15 -> 0.3"):
        train(cfg)


# ------------------------------------------------------------------------------------------- atomic records


CHILD = """
import sys
from pathlib import Path
from mlmlab.results import RunRecord
rec = RunRecord(Path(sys.argv[1]), {"big": "x" * 4_000_000})
rec.set(status="ok", metrics={"downstream/score": 1.0})
print("ready", flush=True)
while True:
    rec.write()
"""


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_sigkill_during_results_write_never_leaves_a_truncated_record(tmp_path):
    """10 writers of a 4 MB record, each SIGKILLed at a random moment of its write loop: results.json is always
    absent or complete (temp file + os.replace), never a truncated file."""
    rng = random.Random(0)
    seen_complete = 0
    for i in range(10):
        out = tmp_path / f"job{i % 2}"  # also kills over an existing complete record
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        f = out / "results.json"
        if f.exists():
            r = json.loads(f.read_text())  # raises on a truncated file
            assert r["status"] == "ok" and len(r["config"]["big"]) == 4_000_000
            seen_complete += 1
    assert seen_complete >= 5


def test_checkpoint_write_is_atomic(tmp_path):
    from mlmlab.checkpoint import atomic_save_checkpoint

    class Dying:
        is_global_zero = True

        def save_checkpoint(self, path):
            Path(path).write_bytes(b"half a checkpo")
            raise KeyboardInterrupt  # killed mid-write

    final = tmp_path / "checkpoints" / "last.ckpt"
    final.parent.mkdir()
    final.write_bytes(b"the previous good checkpoint")
    with pytest.raises(KeyboardInterrupt):
        atomic_save_checkpoint(Dying(), final)
    assert final.read_bytes() == b"the previous good checkpoint"


# ------------------------------------------------------------------------------------------- sweeps


@pytest.mark.slow
def test_sweep_killed_midway_is_completed_by_rerunning_it(tmp_path, cache_dir):
    """A multirun whose machine dies (SIGKILL) in its second job: re-running the same command with
    skip_completed=true skips the finished job and runs the killed one; the summary then says 2 of 2 ok."""
    sweep = tmp_path / "sweep"
    args = ["-m", "debug=fast", "logger=none", "downstream=none", "data.n_docs=200", "trainer.max_steps=4,12",
            f"hydra.sweep.dir={sweep}"]
    p = _cli(args, cache_dir, env={"MLMLAB_FAULT_KILL_AT_STEP": "8"})
    assert p.returncode == -signal.SIGKILL
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert json.loads((jobs[0] / "results.json").read_text())["status"] == "ok"
    assert not (jobs[1] / "results.json").exists()
    assert not (jobs[0] / ".running.json").exists()  # the finished job cleared its marker; the killed one left it
    from mlmlab.sweep import summarize_sweep

    s = summarize_sweep(sweep)
    assert s["ok"] == 1 and s["running"] == [] and [f["status"] for f in s["failed"]] == ["missing"]
    assert s["failed"][0]["error"].startswith("killed (pid ") and s["failed"][0]["error"].endswith(": no results.json")
    first = json.loads((jobs[0] / "results.json").read_text())["finished_at"]

    p = _cli([*args, "skip_completed=true"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    log = p.stdout + p.stderr
    assert f"{jobs[0]}/results.json is complete" in log
    assert json.loads((jobs[0] / "results.json").read_text())["finished_at"] == first  # not run again
    assert json.loads((jobs[1] / "results.json").read_text())["status"] == "ok"
    assert "multirun summary: 2 of 2 jobs ok" in log
    assert json.loads((sweep / "summary.json").read_text())["failed"] == []
    assert not (jobs[1] / ".running.json").exists()


def test_sweep_summary_tells_a_running_job_from_a_killed_one(tmp_path):
    """Two multiruns writing into one sweep dir: the one that ends first must not call the other's running job
    failed. A job dir's marker means `running` while the process it names lives (same pid and start time, not a
    zombie), `missing` (killed) when it is gone; on another host its heartbeat (mtime) decides, and a marker without
    one is `unknown` (not ok); a live marker beside an older record (a job rerun in its dir) is running, not the old
    outcome; a DDP rank > 0's failure is named beside rank 0's outcome."""
    from mlmlab.sweep import STALE_HEARTBEATS, _proc_start, _stop_heartbeat, mark_running, summarize_sweep

    sweep = tmp_path / "sweep"
    names = ("0_done", "1_live", "2_dead", "3_bare", "4_rerun", "5_recycled", "6_elsewhere", "7_elsewhere_stale",
             "8_elsewhere_old", "9_ddp")
    done, live, dead, bare, rerun, recycled, elsewhere, stale, old, ddp = (sweep / n for n in names)
    for d in (done, live, dead, bare, rerun, recycled, elsewhere, stale, old, ddp):
        (d / ".hydra").mkdir(parents=True)
    (done / "results.json").write_text(json.dumps({"status": "ok"}))
    (rerun / "results.json").write_text(json.dumps({"status": "failed", "error": {"type": "X", "message": "old"}}))
    os.utime(rerun / "results.json", (1e9, 1e9))  # the earlier attempt's record, older than the marker
    (ddp / "results.json").write_text(json.dumps({"status": "failed", "error": {"type": "DistError", "message": "r0"},
                                                  "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    for rank, status in ((1, "failed"), (2, "failed"), (3, "failed"), (4, "ok"), (10, "failed")):
        (ddp / f"results.rank{rank}.json").write_text(json.dumps({"status": status,
                                                                  "error": {"type": "OOM", "message": f"r{rank}"}}))
    os.utime(ddp / "results.rank3.json", (1e9, 1e9))  # an earlier attempt's rank 3: not this attempt's outcome
    (ddp / "results.rankings.json").write_text("[]")  # not a rank record
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def marker(d, **kw):
        mark_running(d)
        _stop_heartbeat(d)  # this test sets the markers' ages itself
        m = {**json.loads((d / ".running.json").read_text()), **kw}
        (d / ".running.json").write_text(json.dumps(m))
        return m

    try:
        m = marker(live, pid=child.pid, proc_start=_proc_start(child.pid))  # another process's job, alive
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        marker(dead, pid=int(gone.stdout))  # exited without a record
        marker(rerun, pid=child.pid, proc_start=_proc_start(child.pid))
        if _proc_start(child.pid) is not None:  # Linux: a live pid that is another process than the job's
            marker(recycled, pid=child.pid, proc_start=_proc_start(child.pid) - 1)
        else:
            marker(recycled, pid=int(gone.stdout))
        assert marker(elsewhere, host="another-host")["heartbeat_s"] == 60
        marker(stale, host="another-host")
        t = time.time() - STALE_HEARTBEATS * 60 - 5
        os.utime(stale / ".running.json", (t, t))  # its heartbeat stopped 10 periods ago
        marker(old, host="another-host", heartbeat_s=None)  # a marker without a heartbeat (an older mlmlab)
        assert not list(sweep.rglob("*.tmp"))
        s = summarize_sweep(sweep)
    finally:
        child.kill()
        child.wait()
    assert m["host"] and s["jobs"] == 10 and s["ok"] == 1
    assert {j["dir"] for j in s["running"]} == {"1_live", "4_rerun", "6_elsewhere"}
    assert s["running"][0]["error"].startswith(f"pid {child.pid} on {m['host']}")
    assert "an earlier attempt's" in s["running"][1]["error"]
    age = int(re.search(r"another host, heartbeat ([0-9]+) s ago", s["running"][2]["error"]).group(1))
    assert 0 <= age < 120
    failed = {j["dir"]: (j["status"], j["error"]) for j in s["failed"]}
    assert set(failed) == {"2_dead", "3_bare", "5_recycled", "7_elsewhere_stale", "8_elsewhere_old", "9_ddp"}
    assert failed["2_dead"][0] == failed["5_recycled"][0] == "missing" and "killed" in failed["2_dead"][1]
    assert "no running marker" in failed["3_bare"][1]
    assert failed["7_elsewhere_stale"][0] == "missing"
    age = int(re.search("heartbeat stopped ([0-9]+) s ago", failed["7_elsewhere_stale"][1]).group(1))
    assert STALE_HEARTBEATS * 60 < age < STALE_HEARTBEATS * 60 + 120
    assert failed["8_elsewhere_old"][0] == "unknown" and "another host, no heartbeat" in failed["8_elsewhere_old"][1]
    assert failed["9_ddp"] == ("failed", "DistError: r0; rank 1 failed: OOM: r1; rank 2 failed: OOM: r2; "
                                         "rank 10 failed: OOM: r10")  # by rank; rank 4 was ok
    assert json.loads((sweep / "summary.json").read_text())["running"][0]["dir"] == "1_live"
    # the live process ends without a record: now it is a killed job, and the rerun's old record is not its outcome
    s = summarize_sweep(sweep)
    assert {j["dir"] for j in s["running"]} == {"6_elsewhere"}
    assert {"1_live", "4_rerun"} <= {j["dir"] for j in s["failed"]}
    # a record written after the marker is this attempt's (a marker that could not be removed)
    (rerun / "results.json").write_text(json.dumps({"status": "ok"}))
    assert "4_rerun" not in {j["dir"] for j in summarize_sweep(sweep)["failed"]}
    # rank 0 killed (its marker left, no record) while rank 1 recorded why: both in the summary
    shutil.rmtree(ddp)
    (ddp / ".hydra").mkdir(parents=True)
    marker(ddp, pid=int(gone.stdout))
    (ddp / "results.rank1.json").write_text(json.dumps({"status": "failed", "error": {"type": "OOM", "message": "r1"}}))
    e = {j["dir"]: j["error"] for j in summarize_sweep(sweep)["failed"]}["9_ddp"]
    assert e.startswith("killed (pid") and e.endswith("; rank 1 failed: OOM: r1")
    # a rank's record that names no error: its status alone
    (ddp / "results.rank1.json").write_text(json.dumps({"status": "failed"}))
    e = {j["dir"]: j["error"] for j in summarize_sweep(sweep)["failed"]}["9_ddp"]
    assert e.endswith("; rank 1 failed")
    # rank 0 ended ok while rank 1 failed: the job counts as ok (rank 0's record holds the metrics), the rank is a warning
    (ddp / ".running.json").unlink()
    (ddp / "results.json").write_text(json.dumps({"status": "ok", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    os.utime(ddp / "results.rank1.json", None)
    s = summarize_sweep(sweep)
    assert "9_ddp" not in {j["dir"] for j in s["failed"]}
    assert s["warnings"] == [{"dir": "9_ddp", "error": "rank 1 failed"}]
    assert json.loads((sweep / "summary.json").read_text())["warnings"][0]["dir"] == "9_ddp"


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_running_job_keeps_its_marker_s_heartbeat_until_it_ends(tmp_path):
    """The marker's mtime is the heartbeat a summary on another host reads: touched while the job runs; the thread
    ends when the job clears its marker (also when it would not beat again for an hour), and it neither beats for
    nor removes a marker that another attempt wrote over its own."""
    import threading

    from mlmlab.sweep import clear_running, mark_running

    def beats(d):
        return [t for t in threading.enumerate() if t.name == f"mlmlab-heartbeat:{d.name}"]

    fast, slow, replaced = (tmp_path / n for n in ("fast", "slow", "replaced"))
    for d in (fast, slow, replaced):
        d.mkdir()
    try:
        mark_running(fast, heartbeat_s=0.05)
        mark_running(slow, heartbeat_s=3600)
        mark_running(replaced, heartbeat_s=0.05)
        os.utime(fast / ".running.json", (1e9, 1e9))
        deadline = time.time() + 10
        while (fast / ".running.json").stat().st_mtime < 2e9 and time.time() < deadline:
            time.sleep(0.02)
        assert (fast / ".running.json").stat().st_mtime > time.time() - 60  # touched again
        t_fast, t_slow, t_replaced = beats(fast), beats(slow), beats(replaced)
        assert len(t_fast) == len(t_slow) == len(t_replaced) == 1
        other = {**json.loads((replaced / ".running.json").read_text()), "pid": 1, "host": "another-host"}
        (replaced / ".running.json").write_text(json.dumps(other))  # a rerun elsewhere took the dir over
        os.utime(replaced / ".running.json", (1e9, 1e9))
        t_replaced[0].join(timeout=10)
        assert not t_replaced[0].is_alive()  # stopped by itself: not its marker any more
        assert (replaced / ".running.json").stat().st_mtime == 1e9  # and never touched it
    finally:
        for d in (fast, slow, replaced):
            clear_running(d)
    for t in t_fast + t_slow:
        t.join(timeout=5)
        assert not t.is_alive()  # the slow one only ends because clear_running stops it
    assert not (fast / ".running.json").exists() and not (slow / ".running.json").exists()
    assert json.loads((replaced / ".running.json").read_text())["host"] == "another-host"  # left to its owner


def test_a_ddp_rank_above_zero_keeps_its_record_beside_rank_zeros(cfg_factory, monkeypatch):
    """results.json and the running marker are rank 0's: another rank writes results.rank<N>.json and no marker, so
    a rank that ends first never stands in for the job's outcome."""
    from mlmlab import Job
    from mlmlab.sweep import global_rank

    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert global_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert global_rank() == 2
    monkeypatch.setenv("RANK", "1")
    assert global_rank() == 1
    cfg = cfg_factory("logger=none")
    out = Path(cfg.paths.output_dir)
    with Job(cfg, lambda c: None) as job:
        assert not (out / ".running.json").exists()
        job.done({"x": 1.0})
    assert json.loads((out / "results.rank1.json").read_text())["status"] == "ok"
    assert not (out / "results.json").exists()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="boom"):
        with Job(cfg, lambda c: None):
            assert (out / ".running.json").exists()
            raise RuntimeError("boom")
    assert json.loads((out / "results.json").read_text())["status"] == "failed"
    assert not (out / ".running.json").exists()  # cleared when the job failed, too


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_multirun_with_a_crashing_job_finishes_the_others_and_says_why(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    # a job that passes validation (the grid is validated whole first) and crashes while training: lr 1e30 -> NaN
    p = run_cli(["-m", "debug=fast", "logger=none", "downstream=none", "data.n_docs=200", "trainer.max_steps=3",
                 "optim.lr=1e30,1e-3", f"hydra.sweep.dir={sweep}"], cache_dir)
    assert p.returncode != 0  # Hydra re-raises the first failure, after every job has run
    bad, good = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert json.loads((good / "results.json").read_text())["status"] == "ok"
    r = json.loads((bad / "results.json").read_text())
    assert r["status"] == "failed" and "non-finite loss" in r["error"]["message"]
    log = p.stdout + p.stderr
    assert "multirun summary: 1 of 2 jobs ok, 1 failed" in log and log.count("multirun summary:") == 1
    assert "litlogger" not in log and "LeafSpec" not in log  # library noise (issue 18), not about the job
    assert not (bad / ".running.json").exists() and not (good / ".running.json").exists()
    assert f"FAILED {bad.name}: failed: NonFiniteError: non-finite loss at step" in log
    s = json.loads((sweep / "summary.json").read_text())
    assert s["jobs"] == 2 and [f["dir"] for f in s["failed"]] == [bad.name]


# ------------------------------------------------------------------------------------------- caches


def test_a_corrupt_cache_entry_is_rebuilt_with_a_warning(cfg_factory, tmp_path, caplog):
    import numpy as np

    from mlmlab.data.corpus import get_blocks

    cache = tmp_path / "cache"
    cfg = cfg_factory("data.n_docs=200", f"paths.cache_dir={cache}")
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    want = blocks["train"]["input_ids"].clone()
    (f,) = [p for p in (cache / "blocks").rglob("input_ids.npy") if len(np.load(p)) == len(want)]
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    f.write_bytes(bytes(raw))
    tokjson = next((cache / "tokenizer").rglob("tokenizer.json"))
    tokjson.write_text(tokjson.read_text()[:100])  # truncated
    with caplog.at_level("WARNING", logger="mlmlab.data.cache"):
        tok2, blocks2 = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("blocks/" in m and "does not match its content hash" in m and "input_ids.npy" in m for m in msgs), msgs
    assert any("tokenizer/" in m and "(tokenizer.json has 100 bytes" in m for m in msgs), msgs
    assert torch.equal(blocks2["train"]["input_ids"], want)
    assert tok2.get_vocab() == tok.get_vocab()
    caplog.clear()
    with caplog.at_level("WARNING", logger="mlmlab.data.cache"):
        get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)  # intact now: used as is, silently
    assert not caplog.records
    manifest = next((cache / "tokenizer").rglob("content.json"))
    manifest.unlink()  # an entry from before content hashes: one is recorded, with a warning
    with caplog.at_level("WARNING", logger="mlmlab.data.cache"):
        get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    assert any("has no content hash" in r.getMessage() for r in caplog.records) and manifest.exists()


# ------------------------------------------------------------------------------------------- non-finite


class NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def _poison(monkeypatch, at_step: int, kind: str):
    from mlmlab.lit.mlm import MLMModule

    orig = MLMModule.training_step

    def step(self, batch, batch_idx):
        loss = orig(self, batch, batch_idx)
        if self.global_step == at_step - 1:  # the optimizer step that would complete step `at_step`
            return loss * float("nan") if kind == "loss" else NaNGrad.apply(loss)
        return loss

    monkeypatch.setattr(MLMModule, "training_step", step)


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_nonfinite_stops_the_job_naming_the_step_and_keeps_the_last_good_checkpoint(kind, cfg_factory, tmp_path,
                                                                                     monkeypatch):
    from mlmlab.analysis import read_wandb_offline, wandb_run_dirs
    from mlmlab.guard import NonFiniteError

    _poison(monkeypatch, 6, kind)
    out = tmp_path / "run"
    cfg = cfg_factory("downstream=none", "data.n_docs=200", "trainer.max_steps=10",
                      "trainer.checkpoint_every_n_steps=4", output_dir=out)
    with pytest.raises(NonFiniteError, match=f"non-finite {kind} at step 6"):
        train(cfg)
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "failed" and r["error"]["type"] == "NonFiniteError" and "step 6" in r["error"]["message"]
    assert r["checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 4  # the last good one; nothing saved after the bad step
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    (run_dir,) = wandb_run_dirs(out)
    assert read_wandb_offline(run_dir)["exit_code"] == 1  # failed in W&B too


def test_nonfinite_skip_drops_the_batch_and_counts_it(cfg_factory, tmp_path, monkeypatch):
    _poison(monkeypatch, 3, "loss")
    cfg = cfg_factory("logger=none", "downstream=none", "data.n_docs=200", "trainer.max_steps=6",
                      "trainer.nonfinite=skip", output_dir=tmp_path / "run")
    metrics = train(cfg)
    assert metrics["train/skipped_nonfinite"] == 1.0 and metrics["train/steps"] == 6
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["status"] == "ok" and r["metrics"]["train/skipped_nonfinite"] == 1.0
    params = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.isfinite(v).all() for v in params.values())


# ------------------------------------------------------------------------------------------- W&B


def test_a_failing_wandb_init_does_not_lose_the_result(cfg_factory, tmp_path, monkeypatch):
    import wandb

    def boom(*a, **k):
        raise RuntimeError("wandb service unreachable")

    monkeypatch.setattr(wandb, "init", boom)
    out = tmp_path / "run"
    metrics = train(cfg_factory("downstream=none", "data.n_docs=200", "trainer.max_steps=2", output_dir=out))
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "ok" and r["wandb_error"] == "RuntimeError: wandb service unreachable"
    assert r["metrics"]["val/mlm_loss_r15"] == metrics["val/mlm_loss_r15"]


def test_an_unwritable_wandb_dir_does_not_lose_the_result(cfg_factory, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "wandb").write_text("a file where W&B wants its folder")
    train(cfg_factory("downstream=none", "data.n_docs=200", "trainer.max_steps=2", output_dir=out))
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "ok" and "Not a directory" in r["wandb_error"]  # W&B failed; the record is there


# ------------------------------------------------------------------------------------------- bad data


def test_non_utf8_corpus_names_file_and_line(cfg_factory, tmp_path):
    from mlmlab.data.corpus import get_blocks

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"a fine first line\nanother fine line\nbad \xff\xfe bytes here\nlast\n")
    cfg = cfg_factory("data=text_files", f"data.path={corpus}", f"paths.cache_dir={tmp_path / 'cache'}")
    validate(cfg)
    with pytest.raises(ConfigError, match=rf"data.path: {corpus}, line 3 \(byte 40\): not valid UTF-8"):
        get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    cache = tmp_path / "cache"
    left = [p for p in cache.rglob("*") if p.name == ".lock" or (p.is_dir() and p.parent != cache and not any(p.iterdir()))]
    assert not left, left  # found at the first read, nothing left behind (was: an entry folder holding only its lock)


def test_check_utf8_across_chunk_boundaries(tmp_path):
    from mlmlab.data.corpus import check_utf8

    f = tmp_path / "a.txt"
    f.write_bytes(("é" * 10 + "\n").encode() * 3)
    check_utf8(f, chunk=3)  # multi-byte characters cut by chunk ends are fine
    f.write_bytes(("é" * 10 + "\n").encode() * 3 + b"x\xc3")  # a cut-off character at the very end
    with pytest.raises(ConfigError, match="line 4 .byte 64."):
        check_utf8(f, chunk=4)


def test_long_lines_are_packed_over_blocks_and_counted(cfg_factory, tmp_path):
    from mlmlab.data.corpus import get_blocks

    words = [f"w{i % 50}" for i in range(3000)]
    docs = [" ".join(words)] + [f"short document number {i} with some words" for i in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(docs) + "\n")
    cfg = cfg_factory("data=text_files", f"data.path={corpus}", "data.max_seq_len=32",
                      f"paths.cache_dir={tmp_path / 'cache'}")
    report: dict = {}
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir, report)
    assert report["train"]["long_docs"] == 1 and report["train"]["max_doc_tokens"] >= 3000
    assert report["train"]["blocks"] == len(blocks["train"]["input_ids"]) > 3000 // 30  # chunked, nothing dropped


def test_corpus_smaller_than_one_batch_fails_before_training(cfg_factory, tmp_path):
    cfg = cfg_factory("logger=none", "downstream=none", "data.n_docs=200", "data.batch_size=512",
                      output_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data.batch_size=512 is larger than the \d+ training blocks"):
        train(cfg)
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["status"] == "failed" and r["timings_s"].get("pretrain") is None


def test_resumable_sampler_keeps_the_old_order_and_resumes_anywhere():
    """Same batches as the DataLoader(shuffle=True, generator=seed) the data module used before, epoch after epoch;
    started from any saved (epoch, start) it yields exactly the rest of that stream."""
    from torch.utils.data import DataLoader

    from mlmlab.data.datamodule import ResumableSampler

    ds = list(range(50))
    old = DataLoader(ds, batch_size=8, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(3))
    stream = [b.tolist() for _ in range(4) for b in old]  # 6 batches per epoch
    new = DataLoader(ds, batch_size=8, sampler=ResumableSampler(50, 8, 3), drop_last=True)
    assert [b.tolist() for _ in range(4) for b in new] == stream
    for epoch, start in ((0, 0), (1, 3), (2, 6), (0, 5)):
        s = ResumableSampler(50, 8, 3)
        s.load_state_dict({"epoch": epoch, "start": start})
        dl = DataLoader(ds, batch_size=8, sampler=s, drop_last=True)
        got = [b.tolist() for _ in range(4 - epoch) for b in dl]
        assert got[: len(stream) - 6 * epoch - start] == stream[6 * epoch + start:]


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_sigkill_then_resume_continues_the_same_wandb_run(cache_dir, tmp_path):
    """Issue 19: a SIGKILLed job's offline W&B log keeps its config and every step logged before its last checkpoint
    (the checkpoint waits for W&B's flush), the resumed job logs under the same W&B run id, and the history read back
    is whole: steps 1-14 once each (step 9, logged by the killed job and re-done after the resume, once)."""
    from mlmlab.analysis import load_history, read_wandb_offline, wandb_run_dirs

    run = tmp_path / "run"
    args = [*[a for a in SMALL if a != "logger=none"], "logger=wandb", "logger.wandb.flush_seconds=0.3",
            "trainer.checkpoint_every_n_steps=4", f"hydra.run.dir={run}"]
    p = _cli(args, cache_dir, env={"MLMLAB_FAULT_KILL_AT_STEP": "9"})
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    (killed,) = wandb_run_dirs(run)
    info = read_wandb_offline(killed)
    assert info["config"]["mask"]["rate"] == 0.15 and info["run"]["id"]
    steps = {h["trainer/global_step"] for h in info["history"] if "train/mlm_loss" in h}
    # W&B's x-axis is Lightning's global_step at logging time: 0-7 are steps 1-8, all out before step 9 started
    assert set(range(8)) <= steps, sorted(steps)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["mlmlab"]["wandb_id"] == info["run"]["id"]

    p = _cli([*args, f"resume={run}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    dirs = wandb_run_dirs(run)
    assert len(dirs) == 2 and read_wandb_offline(dirs[1])["run"]["id"] == info["run"]["id"]
    h = load_history(run, keys=["train/mlm_loss"])
    assert h["step"].tolist() == list(range(14))
