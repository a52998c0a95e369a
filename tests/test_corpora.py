"""Pretraining corpus presets (local files in ../shared/data's layout) and mixtures."""

import pytest
from conftest import SHARED

from mlmlab.config import ConfigError, validate
from mlmlab.data.corpus import load_documents
from mlmlab.train import train

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
