"""Every mask preset composes and runs; every masking axis is a CLI override that changes what the model sees."""

from pathlib import Path

import pytest
import torch
from conftest import CONF_DIR
from omegaconf import OmegaConf

from mlmlab import build_recipe
from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, build_schedule, validate
from mlmlab.data import builtin
from mlmlab.data.corpus import get_blocks
from mlmlab.data.vocab_stats import make_sampler_context
from mlmlab.lit.mlm import MLMModule
from mlmlab.masking.masker import IGNORE_INDEX
from mlmlab.models.encoder import EncoderConfig

PRESETS = sorted(p.stem for p in Path(CONF_DIR, "mask").glob("*.yaml"))
QUICK = ["trainer.max_steps=3", "trainer.val_check_interval=3", "downstream.tasks=[]", "logger=none",
         "callbacks.checkpoint=false"]


def word_list(tmp_path) -> str:
    p = tmp_path / "terms.txt"
    lex = builtin.make_lexicon(0, 8)
    p.write_text("# domain terms: the first topic's nouns\n" + "\n".join(lex.nouns[0]) + "\nnotaword\n")
    return str(p)


def zh_corpus(tmp_path) -> str:
    p = tmp_path / "zh.txt"
    lines = ["我们喜欢这家酒店的服务。房间很干净，早餐也不错。", "这本书的内容非常精彩，值得推荐给朋友。",
             "电影的剧情有点拖沓，但是演员的表演很好。", "手机的电池续航时间太短了，不太满意。"]
    p.write_text("\n".join(lines * 60) + "\n", encoding="utf-8")
    return str(p)


def preset_overrides(name: str, tmp_path) -> list[str]:
    if name == "domain_vocab":
        return [f"mask.sampler.word_list={word_list(tmp_path)}"]
    if name == "wwm_zh":
        return ["data=text_files", f"data.path={zh_corpus(tmp_path)}", "downstream.tasks=[]"]
    return []


@pytest.mark.parametrize("name", PRESETS)
def test_every_mask_preset_composes_and_runs(name, cfg_factory, tmp_path):
    assert len(PRESETS) >= 10
    cfg = cfg_factory(f"mask={name}", *QUICK, *preset_overrides(name, tmp_path))
    validate(cfg)
    m = train(cfg)
    assert m["train/steps"] == 3 and m["train/special_selected"] == 0
    assert 0 < m["train/selected_frac"] < 1 and m["val/mlm_loss_r15"] > 0


def masked(cfg, batch):
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    ctx = make_sampler_context(cfg.data, cfg.tokenizer, cfg.paths, tok, blocks)
    enc = EncoderConfig.from_model_cfg(cfg.model, tok.get_vocab_size()).to_dict()
    module = MLMModule(enc, build_recipe(cfg.mask, ctx, blocks["train"]), OmegaConf.to_container(cfg.optim), cfg.seed,
                       cfg.trainer.max_steps)
    return module.mask_batch(batch, 0)[1]


AXES = [
    "mask.rate=0.3",
    "mask.count=exact",
    "mask.count=prob_round",
    "mask.min_per_seq=16",
    "mask.predict_rate=0.3",
    "mask.replace.mask=1.0 mask.replace.random=0.0 mask.replace.keep=0.0",
    "mask.unit=word",
    "mask.unit=span",
    "mask.span.p=0.5 mask.unit=span",
    "mask.dynamic=false",
    "mask/sampler=unigram",
    "mask/sampler=unigram mask.sampler.alpha=0.0",
    "DOMAIN",
    "seed=1",
]


@pytest.mark.parametrize("override", AXES)
def test_each_axis_changes_what_the_model_sees(override, cfg_factory, tmp_path):
    base = cfg_factory()
    tok, blocks = get_blocks(base.data, base.tokenizer, base.paths.cache_dir)
    tr = blocks["train"]
    batch = {k: v[:32] for k, v in tr.items()}
    batch["block_id"] = torch.arange(32)
    ref = masked(base, batch)
    if override == "DOMAIN":
        override = f"mask/sampler=domain mask.sampler.word_list={word_list(tmp_path)} mask.replace.random=0.5 " \
                   "mask.replace.mask=0.4 mask.replace.keep=0.1"
        ref = masked(cfg_factory(*"mask.replace.random=0.5 mask.replace.mask=0.4 mask.replace.keep=0.1".split()), batch)
    if "sampler=unigram" in override:
        ref = masked(cfg_factory("mask.replace.random=0.5", "mask.replace.mask=0.4"), batch)
        override += " mask.replace.random=0.5 mask.replace.mask=0.4"
    out = masked(cfg_factory(*override.split()), batch)
    assert not (torch.equal(out.input_ids, ref.input_ids) and torch.equal(out.labels, ref.labels)), override
    assert not ((out.labels != IGNORE_INDEX) & batch["special_tokens_mask"]).any()


def test_domain_sampler_replaces_with_domain_terms_only(cfg_factory, tmp_path):
    cfg = cfg_factory("mask=domain_vocab", f"mask.sampler.word_list={word_list(tmp_path)}", "mask.replace.mask=0.0",
                      "mask.replace.random=1.0", "mask.replace.keep=0.0", "mask.rate=0.5")
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    batch = {k: v[:32] for k, v in blocks["train"].items()}
    out = masked(cfg, batch)
    nouns = builtin.make_lexicon(0, 8).nouns[0]
    domain = {i for w in nouns for i in tok.encode(w, add_special_tokens=False).ids}  # every piece of every term
    drawn = set(out.input_ids[out.kind == 2].tolist())
    assert drawn and drawn <= domain


def test_schedule_override_changes_the_rate_mid_run(cfg_factory):
    const = build_schedule(cfg_factory().mask)
    lin = build_schedule(cfg_factory("mask=ankner_linear").mask)
    assert const(10, 20) == pytest.approx(0.15)
    assert lin(0, 20) == pytest.approx(0.3) and lin(10, 20) == pytest.approx(0.225) and lin(20, 20) == pytest.approx(0.15)
    step = build_schedule(cfg_factory("mask/schedule=step").mask)
    assert step(0, 300) == 0.3 and step(299, 300) == 0.15


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["mask/schedule=linear", "mask.schedule.end=0.0"], "mask.schedule"),
        (["mask/schedule=step", "mask.schedule.milestones=[0.6,0.3]"], "sorted"),
        (["mask/schedule=linear", "mask.rate=0.5", "mask.schedule.end=1.2"], "in \\(0, 1\\)"),
        (["mask.count=poisson"], "mask.count"),
        (["mask.unit=phrase"], "mask.unit"),
        (["mask.predict_rate=1.5"], "mask.predict_rate"),
        (["mask/sampler=unigram", "mask.sampler.alpha=-1"], "mask.sampler.alpha"),
        (["mask/sampler=domain"], "word_list"),
        (["mask/sampler=domain", "mask.sampler.mix=1.5", "mask.sampler.word_list=x.txt"], "mask.sampler.mix"),
        (["mask.static_copies=0"], "mask.static_copies"),
        (["mask.span.min_len=5", "mask.span.max_len=2"], "mask.span"),
    ],
)
def test_bad_mask_config_rejected_before_training(overrides, match, cfg_factory):
    with pytest.raises(ConfigError, match=match):
        validate(cfg_factory(*overrides))


def test_domain_word_list_out_of_vocabulary_is_reported(cfg_factory, tmp_path):
    p = tmp_path / "oov.txt"
    p.write_text("12345\n日本語\n")  # characters the built-in language never uses: [UNK] only
    cfg = cfg_factory("mask=domain_vocab", f"mask.sampler.word_list={p}")
    validate(cfg)
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    with pytest.raises(ConfigError, match="out of vocabulary"):
        build_recipe(cfg.mask, make_sampler_context(cfg.data, cfg.tokenizer, cfg.paths, tok, blocks), blocks["train"])
    with pytest.raises(ConfigError, match="mask.sampler"):
        train(cfg_factory("mask=domain_vocab", f"mask.sampler.word_list={tmp_path / 'missing.txt'}", *QUICK))


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   \n"])
def test_an_empty_domain_word_list_is_refused_at_validation(cfg_factory, tmp_path, text):
    """Issue 54 item 14: before the tokenizer and blocks are built (minutes on a real corpus)."""
    p = tmp_path / "terms.txt"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"mask.sampler.word_list=.*holds no entries \(empty, or only blank and #"):
        validate(cfg_factory("mask=domain_vocab", f"mask.sampler.word_list={p}"))
