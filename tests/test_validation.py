"""Every YAML composes and validates; bad input fails early with the key and the allowed values."""

import json
from pathlib import Path

import pytest
from conftest import CONF_DIR, SHARED

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate

DATA_DIR_PRESETS = ({f"data={n}" for n in ("imdb", "wikitext2", "zh", "finance", "medical", "finance_mix", "medical_mix")}
                    | {f"experiment={n}" for n in ("real_en", "real_finance", "real_zh", "real_medical", "dapt_finance",
                                                 "dapt_medical")}
                    | {"mask/sampler=domain_finance", "mask/sampler=domain_medical"})  # its corpus file is checked at validation


def all_options():
    """Every option of every config group, nested groups (mask/schedule, mask/sampler) included."""
    root = Path(CONF_DIR)
    for group in sorted(p for p in root.rglob("*") if p.is_dir()):
        for f in sorted(group.glob("*.yaml")):
            yield f"{group.relative_to(root).as_posix()}={f.stem}"


@pytest.mark.parametrize("option", list(all_options()))
def test_every_yaml_composes_and_validates(option, cfg_factory, tmp_path, bf16_host):
    # bf16_host: the GPU presets ask for bf16-mixed, checked on a host without CUDA against the CPU's own bf16
    extra = []
    if option == "data=text_files":
        f = tmp_path / "c.txt"
        f.write_text("one document\nanother document\n")
        extra = [f"data.path={f}"]
    if option == "data=hub":
        extra = ["data.hub=imdb"]  # composes and validates without touching the hub (loading happens in the job)
    if option in ("mask=domain_vocab", "mask/sampler=domain"):
        terms = tmp_path / "terms.txt"  # validation checks that the file exists; it is read when the sampler is built
        terms.write_text("profit\n")
        extra = [f"mask.sampler.word_list={terms}"]
    if option in DATA_DIR_PRESETS:
        if not SHARED.is_dir():
            pytest.skip(f"{option} reads {SHARED}, which is not here")
        extra = [f"paths.data_dir={SHARED}"]
    validate(cfg_factory(option, *extra))


@pytest.mark.parametrize("overrides", [["mask.rat=0.2"], ["mask.rate=abc"], ["data=nope"], ["objective=nope"],
                                       ["model=nope"]])
def test_compose_time_errors(overrides, cfg_factory):
    with pytest.raises(Exception) as e:
        cfg_factory(*overrides)
    key = overrides[0].split("=")[0]
    assert key.split(".")[-1] in str(e.value) or "nope" in str(e.value)


BAD = [
    (["mask.rate=1.5"], "mask.rate=1.5 must be in the open interval (0, 1)"),
    (["mask.rate=0"], "mask.rate=0.0 must be in the open interval (0, 1)"),
    (["mask.replace.mask=0.9"], "must sum to 1"),
    (["mask.replace.random=-0.1", "mask.replace.mask=1.0"], "mask.replace.random=-0.1 must be >= 0"),
    (["downstream.tasks=[nope]"], "downstream.tasks[0]='nope' is not known; allowed: bc5cdr, blimp, builtin_sentiment, builtin_topic"),
    (["data=text_files", "data.path=/does/not/exist"], "data.path='/does/not/exist' does not exist"),
    (["data.max_seq_len=256"], "exceeds model.max_position_embeddings=128"),
    (["tokenizer.vocab_size=3"], "must be larger than the 5 special tokens"),
    (["eval.rate=1.0"], "eval.rate=1.0 must be in the open interval"),
    (["eval.units=[token,phrase]"], "eval.units=['token', 'phrase'] must be a non-empty list of distinct units (or "
                                    "null: [token]); allowed: token, word"),
    (["eval.units=[]"], "eval.units=[] must be a non-empty list"),
    (["eval.units=[token,word]", "objective=electra"], "units after the first are scored at the end for objective=mlm"),
    (["eval.per_source=true"], "eval.per_source=true scores each source of data.mix separately; data=builtin has no "
                               "data.mix (allowed: false, or a mixture"),
    (["logger.wandb.mode=bogus"], "allowed: offline, online, disabled"),
    (["trainer.threads=0"], "trainer.threads=0; allowed: auto, or an integer >= 1"),
    (["trainer.threads=many"], "trainer.threads='many'; allowed: auto, or an integer >= 1"),
    (["logger.wandb.flush_seconds=0"], "logger.wandb.flush_seconds=0.0 must be in (0, 60]"),
    # Hydra rejects mask.rat=0.2, but '+' adds the key: every key under a typed group must be known
    (["+mask.rat=0.2"], "unknown config key mask.rat (a typo, or a '+' override"),
    (["+mask.replace.masks=0.5", "+trainer.budget.second=5"], "unknown config keys mask.replace.masks, "
                                                             "trainer.budget.second"),
    (["+seeds=3"], "unknown config key seeds"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_validate_rejects(overrides, message, cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory(*overrides))
    assert message in str(e.value)


def test_empty_text_files_rejected(cfg_factory, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no .txt files"):
        validate(cfg_factory("data=text_files", f"data.path={tmp_path / 'empty'}"))
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    with pytest.raises(ConfigError, match="holds no text"):
        validate(cfg_factory("data=text_files", f"data.path={tmp_path / 'empty'}"))


def test_error_raised_before_any_work(tmp_path):
    from conftest import make_cfg

    cache, out = tmp_path / "cache", tmp_path / "out"
    cfg = make_cfg(["debug=fast", "logger=none", "mask.rate=1.5"], out, cache)
    with pytest.raises(ConfigError):
        train(cfg)
    assert not cache.exists()  # no data work happened
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "failed" and "mask.rate=1.5" in r["error"]["message"]


@pytest.mark.parametrize("overrides,message", [
    (["seed=-1"], "seed=-1 must be an integer in [0, 2**32 - 1]"),
    (["mask=domain_vocab", "mask.sampler.word_list=/missing.txt", "mask.sampler.corpus=null"],
     "mask.sampler.word_list='/missing.txt' does not exist"),
])
def test_late_errors_now_come_before_any_data_work(overrides, message, cfg_factory, tmp_path, monkeypatch):
    import mlmlab.data.corpus as corpus

    def no_data(*a, **k):
        raise AssertionError("data work started before the config error")

    monkeypatch.setattr(corpus, "get_blocks", no_data)
    with pytest.raises(ConfigError) as e:
        train(cfg_factory(*overrides, "logger=none", output_dir=tmp_path / "run"))
    assert message in str(e.value)


def test_a_resume_with_another_config_fails_before_data_work(cfg_factory, tmp_path, monkeypatch):
    first = tmp_path / "first"
    train(cfg_factory("downstream=none", "logger=none", "trainer.max_steps=4", output_dir=first))
    import mlmlab.data.corpus as corpus

    monkeypatch.setattr(corpus, "get_blocks", lambda *a, **k: (_ for _ in ()).throw(AssertionError("data work")))
    with pytest.raises(ConfigError, match="the checkpoint was made with a different config"):
        train(cfg_factory("downstream=none", "logger=none", "trainer.max_steps=4", "mask.rate=0.3",
                          f"resume={first}", output_dir=tmp_path / "second"))


@pytest.mark.parametrize(("setting", "jobs", "cores", "threads", "warns"), [
    ("auto", None, 2, None, False),  # a job alone keeps torch's default
    ("auto", 2, 2, 1, False),  # hydra/launcher=cores on this machine: 2 jobs x 1 thread
    ("auto", 2, 16, 8, False),
    ("auto", 4, 2, 1, True),  # more jobs than cores: still 1 thread each, and a warning naming both numbers
    (3, 2, 2, 3, True),
    (1, None, 2, 1, False),
])
def test_job_threads_split_the_cores(setting, jobs, cores, threads, warns):
    from mlmlab.hardware import job_threads

    got, warning = job_threads(setting, jobs, cores)
    assert got == threads and bool(warning) == warns
    if warns:
        assert f"on {cores} cores" in warning and f"{jobs} parallel jobs x {threads} threads" in warning


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_downstream_none_under_a_preset_that_sets_tasks_is_an_error(tmp_path, cache_dir):
    """`experiment=real_en downstream=none` would still fine-tune (the preset's downstream.tasks merge after the group
    choice): a clear error before any data work, naming the key and what to write instead."""
    from conftest import run_cli

    out = tmp_path / "run"
    p = run_cli(["experiment=real_en", "downstream=none", f"hydra.run.dir={out}"], cache_dir, full_error=False)
    assert p.returncode != 0
    assert "downstream=none was chosen" in p.stderr and "downstream.tasks=[]" in p.stderr, p.stderr[-1500:]
    assert json.loads((out / "results.json").read_text())["status"] == "failed"
    assert not (out / "checkpoints").exists()  # nothing was trained
