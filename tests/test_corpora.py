"""Pretraining corpus presets (local files in ../shared/data's layout) and mixtures."""

import pytest
from conftest import SHARED

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate
from mlmlab.data.corpus import load_documents

PRESETS = {"imdb": (19051, 763), "wikitext2": None, "zh": (61457, 3234), "finance": (22041, 1160),
           "medical": (692 + 31466, 100 + 13305)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_read_the_shared_data(name, cfg_factory):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not here")
    cfg = cfg_factory(f"data={name}", f"paths.data_dir={SHARED}")
    validate(cfg)
    docs = load_documents(cfg.data)
    assert docs["train"] and docs["validation"] and docs["train"][0] != docs["validation"][0]
    if PRESETS[name] is not None:  # blank lines are not documents
        slack = 1.01 if cfg.data.mix else 1.0  # a mixture repeats a few documents of the source that runs out first
        assert len(docs["train"]) <= slack * PRESETS[name][0] and len(docs["validation"]) <= PRESETS[name][1]
        assert len(docs["train"]) > 0.9 * PRESETS[name][0]


def test_preset_without_a_data_dir_says_what_to_set(cfg_factory):
    with pytest.raises(ConfigError, match="set paths.data_dir or MLMLAB_DATA_DIR"):
        validate(cfg_factory("data=imdb", "paths.data_dir=null"))


def write(tmp_path, name, word, n):
    p = tmp_path / f"{name}.txt"
    p.write_text("".join(f"{word} {i} some words here\n" for i in range(n)))
    return p


def test_mixture_follows_the_weights(cfg_factory, tmp_path):
    a, b = write(tmp_path, "a", "alpha", 300), write(tmp_path, "b", "beta", 300)
    cfg = cfg_factory("data=text_files", "data.path=null",
                      f"+data.mix=[{{path: '{a}', weight: 3}}, {{path: '{b}', weight: 1}}]")
    validate(cfg)
    docs = load_documents(cfg.data)
    share = sum(d.startswith("alpha") for d in docs["train"]) / len(docs["train"])
    assert abs(share - 0.75) < 0.05, share
    assert {d.split()[0] for d in docs["validation"]} == {"alpha", "beta"}  # each source's held-out part
    assert len({d for d in docs["train"] if d.startswith("beta")}) == 294  # every (non-held-out) doc of b is used


def test_bad_mixtures_rejected(cfg_factory, tmp_path):
    a = write(tmp_path, "a", "alpha", 10)
    with pytest.raises(ConfigError, match=r"data.mix\[0\].weight=0 must be a number > 0"):
        validate(cfg_factory("data=text_files", "data.path=null", f"+data.mix=[{{path: '{a}', weight: 0}}]"))
    with pytest.raises(ConfigError, match=r"data.mix\[0\].path='/nope' does not exist"):
        validate(cfg_factory("data=text_files", "data.path=null", "+data.mix=[{path: /nope}]"))
    with pytest.raises(ConfigError, match="set data.path or data.mix, not both"):
        validate(cfg_factory("data=text_files", f"data.path={a}", f"+data.mix=[{{path: '{a}'}}]"))


def test_a_preset_pretrains_end_to_end(cfg_factory):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not here")
    m = train(cfg_factory("data=wikitext2", f"paths.data_dir={SHARED}", "data.max_seq_len=64", "data.batch_size=16",
                          "tokenizer.vocab_size=2000", "trainer.max_steps=3", "trainer.val_check_interval=3",
                          "downstream.tasks=[]", "logger=none", "callbacks.checkpoint=false"))
    assert m["train/steps"] == 3 and m["val/mlm_loss_r15"] > 0


def test_per_source_losses_of_a_mixture(cfg_factory, tmp_path):
    """eval.per_source=true: each source's validation documents packed on their own (source 0's blocks are the mixture's
    first blocks; together they hold the mixture's tokens), scored at the end as val/mlm_loss_r15_mix<i>, recorded in
    results.json; the main loss is unchanged, and a resume may add it (evaluation only)."""
    import json

    import torch
    from conftest import prepared
    from omegaconf import OmegaConf

    from mlmlab.checkpoint import RESUME_FREE, config_diff

    a, b = write(tmp_path, "a", "alpha", 300), write(tmp_path, "b", "beta gamma", 300)
    base = ("data=text_files", "data.path=null", f"+data.mix=[{{path: '{a}', weight: 1}}, {{path: '{b}', weight: 1}}]",
            "logger=none", "downstream=none", "callbacks.checkpoint=false")
    cfg = cfg_factory(*base, "eval.per_source=true", output_dir=tmp_path / "per_source")
    data = prepared(cfg)
    s0, s1, mixed = data.source_val[0]["input_ids"], data.source_val[1]["input_ids"], data.val_blocks["input_ids"]
    assert torch.equal(s0[:-1], mixed[: len(s0) - 1])
    n_body = lambda x: int((x > 4).sum())  # noqa: E731 -- ids 0-4 are the special tokens
    assert n_body(s0) + n_body(s1) == n_body(mixed) and n_body(s0) > 0 and n_body(s1) > 0
    both = train(cfg)
    one = train(cfg_factory(*base, output_dir=tmp_path / "main"))
    assert both["val/mlm_loss_r15"] == one["val/mlm_loss_r15"] and "val/mlm_loss_r15_mix0" not in one
    assert {"val/mlm_loss_r15_mix0", "val/mlm_acc_r15_mix0", "val/mlm_loss_r15_mix1"} <= set(both)
    assert both["val/mlm_loss_r15_mix0"] != both["val/mlm_loss_r15_mix1"]
    r = json.loads((tmp_path / "per_source" / "results.json").read_text())
    assert [(v["suffix"], v["source"], v["blocks"]) for v in r["data"]["val_sources"]] == [
        ("mix0", str(a), len(s0)), ("mix1", str(b), len(s1))]
    before = OmegaConf.to_container(cfg_factory(*base))
    assert config_diff(before, OmegaConf.to_container(cfg), RESUME_FREE) == []
