"""``init.*``: continued pretraining from an mlmlab checkpoint or a transformers directory (mlmlab.init)."""

import json

import pytest
import torch
from conftest import FAST, make_cfg, run_cli

from mlmlab.config import ConfigError
from mlmlab.export import export
from mlmlab.init import locate, read
from mlmlab.train import train


@pytest.fixture(scope="module")
def start(tmp_path_factory, cache_dir):
    """A tiny pretrained MLM (post-LN) and a pre-LN one, each with its export."""
    out = {}
    for norm in ("post", "pre"):
        run = tmp_path_factory.mktemp(f"start_{norm}")
        cfg = make_cfg([*FAST, f"model.norm={norm}", "logger=none", "downstream.tasks=[]"], run, cache_dir)
        metrics = train(cfg)
        hf = run / "hf"
        export(str(run / "checkpoints" / "last.ckpt"), str(hf))
        out[norm] = (run, hf, metrics)
    return out


def _logits(s, ids):
    return s.model()(ids, torch.ones_like(ids, dtype=torch.bool))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_export_then_init_gives_the_same_model(start, norm):
    run, hf, _ = start[norm]
    a, b = read(*locate(str(run))), read(*locate(str(hf)))
    assert a.record["kind"] == "mlmlab" and b.record["kind"] == "hf" and len(a.record["sha256"]) == 64
    assert {k: v for k, v in a.encoder_cfg.items() if k not in ("dropout", "attention_dropout")} == \
        {k: v for k, v in b.encoder_cfg.items() if k not in ("dropout", "attention_dropout")}
    assert a.tok.to_str() != "" and a.tok.encode("the cat").ids == b.tok.encode("the cat").ids  # no [CLS]/[SEP] added
    ids = torch.randint(5, a.encoder_cfg["vocab_size"], (3, 17))
    torch.testing.assert_close(_logits(a, ids), _logits(b, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("source", ["ckpt", "hf"])
def test_a_job_started_from_a_checkpoint_is_that_encoder(start, source, tmp_path, cache_dir):
    """objective=none from the start: the fixed-mask loss is the start's own final one (same tokenizer, shape, weights,
    head); the shape comes from the checkpoint and the record names it."""
    run, hf, pre = start["post"]
    src = run / "checkpoints" / "last.ckpt" if source == "ckpt" else hf
    cfg = make_cfg([*FAST, "objective=none", f"init.checkpoint={src}", "logger=none", "downstream.tasks=[]",
                    "model=small"], tmp_path / "none", cache_dir)  # model=small: replaced by the start's shape
    m = train(cfg)
    assert m["val/mlm_loss_r15"] == pytest.approx(pre["val/mlm_loss_r15"], abs=2e-4)
    rec = json.loads((tmp_path / "none" / "results.json").read_text())
    assert rec["init"]["kind"] == ("mlmlab" if source == "ckpt" else "hf") and len(rec["init"]["sha256"]) == 64
    assert rec["config"]["model"]["hidden_size"] == json.loads((run / "results.json").read_text())["config"]["model"][
        "hidden_size"]
    assert rec["config"]["model"]["name"] == "start"  # not "small": the shape is the start's (issue 54 item 6)
    if source == "ckpt":  # where the start stood in its run, and that run's status
        assert (rec["init"]["step"], rec["init"]["max_steps"], rec["init"]["run_status"]) == (
            pre["train/steps"], pre["train/steps"], "ok")


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_start_that_is_not_what_it_seems_is_refused_or_says_so(start, tmp_path, cache_dir):
    """Issue 54 item 6: the checkpoint of a failed run is refused (resume it first); objective=none from a start
    without an MLM head records no fixed-mask loss (a random head's loss is not the start's)."""
    import shutil

    from safetensors.torch import load_file, save_file

    run, hf, _ = start["post"]
    failed = tmp_path / "failed"
    shutil.copytree(run, failed, ignore=shutil.ignore_patterns("hf", "wandb"))
    rec = json.loads((failed / "results.json").read_text())
    (failed / "results.json").write_text(json.dumps({**rec, "status": "failed"}))
    with pytest.raises(ConfigError, match=r"is the checkpoint of an unfinished run \(status 'failed'.*resume="):
        read(*locate(str(failed)))
    headless = tmp_path / "headless"
    shutil.copytree(hf, headless)
    weights = load_file(str(headless / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in weights.items() if not k.startswith("cls.")}, str(headless / "model.safetensors"))
    m = train(make_cfg([*FAST, "objective=none", f"init.checkpoint={headless}", "logger=none", "downstream.tasks=[]"],
                       tmp_path / "none", cache_dir))
    assert not any(k.startswith("val/mlm_") for k in m)
    rec = json.loads((tmp_path / "none" / "results.json").read_text())
    assert "val/mlm_loss_r15" in rec["init"]["no_mlm_head"] and "phase" not in rec


def test_continued_pretraining_of_every_objective_and_both_gains(start, tmp_path, cache_dir):
    run, _, pre = start["post"]
    for obj in ("mlm", "electra"):
        cfg = make_cfg([*FAST, f"objective={obj}", f"init.checkpoint={run}", "logger=none", "trainer.max_steps=10",
                        "downstream.random_init_baseline=true", "downstream.tasks=[builtin_sentiment]"],
                       tmp_path / obj, cache_dir)
        m = train(cfg)
        for k in ("start/builtin_sentiment/acc", "gain/builtin_sentiment/acc", "random_init/builtin_sentiment/acc",
                  "gain_random_init/builtin_sentiment/acc"):
            assert k in m, (obj, k)
        assert m["gain/builtin_sentiment/acc"] == pytest.approx(
            m["downstream/builtin_sentiment/acc"] - m["start/builtin_sentiment/acc"])
    # MLM: 10 more steps from the start stay near its loss (a random init of the tiny model sits near log V)
    assert abs(json.loads((tmp_path / "mlm" / "results.json").read_text())["metrics"]["val/mlm_loss_r15"]
               - pre["val/mlm_loss_r15"]) < 0.3


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_bad_starts_are_one_line_errors_before_data_work(start, tmp_path, cache_dir):
    run, _, _ = start["post"]
    for args, msg in (
        ([f"init.checkpoint={tmp_path}/nope.ckpt"], "does not exist"),
        ([f"init.checkpoint={run}", "model.hidden_size=48"], "model.hidden_size=48 contradicts the start"),
        ([f"init.checkpoint={run}", "tokenizer.vocab_size=1024"], "tokenizer.vocab_size=1024 contradicts the start"),
        ([f"init.checkpoint={run}", "init.pretrain=['seed=1']"], "set init.checkpoint or init.pretrain, not both"),
        ([f"init.checkpoint={tmp_path}"], "neither checkpoints/last.ckpt"),
    ):
        p = run_cli([*FAST, *args, f"hydra.run.dir={tmp_path / 'x'}"], cache_dir, full_error=False)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and msg in err[-1], (args, p.stderr[-600:])
        assert "Traceback" not in p.stderr and not (tmp_path / "x" / "checkpoints").exists()


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_init_pretrain_makes_the_start_once(tmp_path, cache_dir):
    over = "init.pretrain=['debug=fast','trainer.max_steps=6','seed=3']"
    out = []
    for i in range(2):
        cfg = make_cfg([*FAST, over, "logger=none", "downstream.tasks=[]", "trainer.max_steps=4"], tmp_path / f"r{i}",
                       cache_dir)
        train(cfg)
        out.append(json.loads((tmp_path / f"r{i}" / "results.json").read_text()))
    assert out[0]["init"]["sha256"] == out[1]["init"]["sha256"] and out[0]["init"]["cache_key"]
    assert out[1]["timings_s"]["init"] < out[0]["timings_s"]["init"]  # the second job reads the cached start
    with pytest.raises(ConfigError, match="init.pretrain"):
        train(make_cfg([*FAST, "init.pretrain=[nokey]", "logger=none"], tmp_path / "bad", cache_dir))


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_a_grid_with_a_start_is_validated_whole_before_any_job(start, tmp_path, cache_dir):
    """Issue 54 item 11: a model.* arm that contradicts init.checkpoint, and a bad init.pretrain override, are refused
    when the grid is validated -- no arm has trained, no start has been built."""
    run, _, _ = start["post"]
    hidden = json.loads((run / "results.json").read_text())["config"]["model"]["hidden_size"]
    p = run_cli(["-m", *FAST, "logger=none", "downstream.tasks=[]", f"init.checkpoint={run}",
                 f"model.hidden_size={hidden},{hidden * 2}", f"hydra.sweep.dir={tmp_path / 'a'}"], cache_dir,
                full_error=False)
    assert p.returncode != 0
    assert f"model.hidden_size={hidden * 2} contradicts the start" in p.stderr and "(no job of the 2 has run)" in p.stderr
    assert not list((tmp_path / "a").rglob("results.json"))
    p = run_cli(["-m", *FAST, "logger=none", "downstream.tasks=[]", "init.pretrain=['debug=fast','trainer.max_stepz=3']",
                 "seed=0,1", f"hydra.sweep.dir={tmp_path / 'b'}"], cache_dir, full_error=False)
    assert p.returncode != 0 and "init.pretrain=['debug=fast', 'trainer.max_stepz=3']: the start's job cannot be " \
        "composed" in p.stderr and "(no job of the 2 has run)" in p.stderr
    assert not list((tmp_path / "b").rglob("results.json"))


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_init_pretrain_errors_say_the_start_s_own_error(tmp_path, cache_dir):
    """Issue 54 item 12: the start's job's one-line error (not Hydra's HYDRA_FULL_ERROR pointer, nor a deleted record's
    path); the unquoted list form gets a hint to quote its items, before Hydra's grammar error."""
    from mlmlab.checks import check_argv
    from mlmlab.init import child_error

    assert child_error("x\nerror: model.norm='a' is not known (record: /tmp/.run1/results.json)\nSet the environment "
                       "variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n") == "model.norm='a' is not known"
    assert child_error("Traceback ...\nValueError: boom\nSet the environment variable HYDRA_FULL_ERROR=1 for a "
                       "complete stack trace.") == "ValueError: boom"
    assert check_argv(["init.pretrain=[debug=fast,seed=0]"]) == (
        "init.pretrain=[debug=fast,seed=0]: quote each item, which is itself an override: "
        "\"init.pretrain=['debug=fast','seed=0']\"")
    assert check_argv(["init.pretrain=['debug=fast','seed=0']", "seed=1"]) is None
    p = run_cli([*FAST, "init.pretrain=[debug=fast,seed=0]", f"hydra.run.dir={tmp_path / 'x'}"], cache_dir,
                full_error=False)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: init.pretrain=[debug=fast,seed=0]: "
                                                                               "quote each item")
    p = run_cli([*FAST, "logger=none", "downstream.tasks=[]", "init.pretrain=['debug=fast','model.norm=sideways']",
                 f"hydra.run.dir={tmp_path / 'y'}"], cache_dir, full_error=False)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and "the start's job failed: model.norm='sideways' is not known; allowed: post, pre" in last
    assert ".run" not in last  # no path of the start's deleted folder


def test_init_pretrain_passes_the_cache_dir_expanded(tmp_path, monkeypatch):
    """paths.cache_dir's default starts with "~", which Hydra's override grammar refuses in the start's command line:
    the start's job gets it expanded; a grammar error reads as its own line, not as Hydra's pointer to its docs."""
    import subprocess

    from mlmlab.init import pretrained_start

    monkeypatch.setenv("HOME", str(tmp_path))
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "hydra.errors.OverrideParseException: LexerNoViableAltException: "
                                           "x=~/y\nSee https://hydra.cc/docs/1.2/advanced/override_grammar/basic for "
                                           "details\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(ConfigError, match=r"the start's job failed: hydra.errors.OverrideParseException: "):
        pretrained_start(["debug=fast", "seed=0"], "~/.cache/mlmlab", None)
    assert f"paths.cache_dir={tmp_path}/.cache/mlmlab" in seen[0] and not any("=~" in c for c in seen[0])
