"""The real-text budget recipe: pre-LN options, the seconds budget, bf16 checks, the random-init
baseline in the same job with paired gains, the unigram plateau reference, HTML clean-up, the real-text presets."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import SHARED

from mlmlab import pretrain_job as train
from mlmlab import unigram_reference
from mlmlab.config import ConfigError, validate
from mlmlab.data.corpus import strip_html
from mlmlab.downstream import paired_gain


@pytest.mark.parametrize("overrides,message", [
    (["model.norm=sideways"], "model.norm='sideways' is not known; allowed: post, pre"),
    (["model.position=alibi"], "model.position='alibi' is not known; allowed: learned, rope"),
    (["model.position=rope", "model.hidden_size=12", "model.num_heads=4"], "model.position=rope needs an even head size"),
    (["optim.warmup_frac=1.0"], "optim.warmup_frac=1.0 must be in [0, 1)"),
    (["optim.warmup_frac=-0.1"], "optim.warmup_frac=-0.1 must be in [0, 1)"),
    (["trainer.budget.seconds=0"], "trainer.budget.seconds=0"),
    (["trainer.budget.seconds=-5"], "trainer.budget.seconds=-5"),
    (["trainer.budget.seconds=60", "trainer.budget.tokens=1e6"], "set at most one budget"),
    (["trainer.budget.seconds=60", "trainer.devices=2", "trainer.accelerator=cpu"], "calibrates the step count on one"),
    (["downstream.max_selection_examples=0"], "downstream.max_selection_examples=0 must be >= 1"),
    (["downstream.finetune.layer_decay=1.5"], "downstream.finetune.layer_decay=1.5 must be in (0, 1] or null"),
    (["downstream.finetune.layer_decay=0"], "downstream.finetune.layer_decay=0.0 must be in (0, 1] or null"),
])
def test_recipe_keys_rejected_before_any_work(overrides, message, cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory(*overrides))
    assert message in str(e.value)


def test_bf16_on_a_cpu_without_it_is_an_error_and_auto_falls_back(cfg_factory, monkeypatch):
    import mlmlab.hardware as hw

    monkeypatch.setattr(hw, "cpu_bf16_supported", lambda: False)
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory("trainer.precision=bf16-mixed", "trainer.accelerator=cpu"))
    assert "trainer.precision=bf16-mixed" in str(e.value) and "allowed here: trainer.precision=32-true" in str(e.value)
    validate(cfg_factory("trainer.precision=auto", "trainer.accelerator=cpu"))
    assert hw.resolve_precision("auto", "cpu") == "32-true"
    monkeypatch.setattr(hw, "cpu_bf16_supported", lambda: True)
    assert hw.resolve_precision("auto", "cpu") == "bf16-mixed"
    assert hw.resolve_precision("32-true", "cpu") == "32-true"


def test_seconds_budget_calibrates_a_step_count_and_records_it(cfg_factory, tmp_path):
    out = tmp_path / "run"
    m = train(cfg_factory("trainer.budget.seconds=2", "trainer.val_check_interval=5", "downstream=none",
                          "logger=none", "model.norm=pre", "optim.warmup_frac=0.1", output_dir=out))
    r = json.loads((out / "results.json").read_text())
    cal = r["budget"]["calibration"]
    assert cal["seconds"] == 2 and cal["probe_steps"] >= 1 and cal["s_per_step"] > 0
    # the run is an ordinary step run of the calibrated length, and the record says how to repeat it
    assert m["train/steps"] == cal["steps"] == r["budget"]["steps"] >= 1
    assert cal["steps"] == math.floor(2 / (cal["s_per_step"] + cal["val_s"] / 5))
    assert r["timings_s"]["calibrate"] > 0


def test_calibration_leaves_the_run_reproducible_from_its_step_count(cfg_factory, tmp_path):
    """The probe uses its own RNG scope and loader: rerunning with trainer.max_steps=<recorded steps> is the same run."""
    a = train(cfg_factory("trainer.budget.seconds=1", "downstream=none", "logger=none", output_dir=tmp_path / "a"))
    steps = int(a["train/steps"])
    b = train(cfg_factory(f"trainer.max_steps={steps}", "downstream=none", "logger=none", output_dir=tmp_path / "b"))
    assert b["train/steps"] == steps
    assert a["val/mlm_loss_r15"] == pytest.approx(b["val/mlm_loss_r15"], abs=1e-6)


def test_paired_gain_is_the_per_seed_difference_with_a_t_interval():
    from scipy import stats

    pre = {f"downstream/t/seed_{s}/acc": v for s, v in zip(range(4), [0.80, 0.78, 0.83, 0.79])}
    base = {f"downstream/t/seed_{s}/acc": v for s, v in zip(range(4), [0.74, 0.75, 0.76, 0.73])}
    g = paired_gain(pre, base, {"t": "acc"}, [0, 1, 2, 3])
    d = [0.06, 0.03, 0.07, 0.06]
    assert g["gain/t/acc"] == pytest.approx(sum(d) / 4)
    assert g["gain/t/seed_2/acc"] == pytest.approx(0.07)
    half = stats.t.ppf(0.975, 3) * stats.tstd(d) / 2
    assert g["gain/t/acc_ci95"] == pytest.approx(half)
    assert g["gain/t/acc_p"] == pytest.approx(stats.ttest_rel(list(pre.values()), list(base.values())).pvalue)


def test_random_init_baseline_runs_the_same_protocol_in_the_job(cfg_factory, tmp_path):
    out = tmp_path / "run"
    m = train(cfg_factory("downstream.random_init_baseline=true", "downstream.tasks=[builtin_sentiment]",
                          "downstream.seeds=[0,1]", "logger=none", output_dir=out))
    for s in (0, 1):
        assert m[f"gain/builtin_sentiment/seed_{s}/acc"] == pytest.approx(
            m[f"downstream/builtin_sentiment/seed_{s}/acc"] - m[f"random_init/builtin_sentiment/seed_{s}/acc"])
    assert "random_init/score" in m and "gain/builtin_sentiment/acc_ci95" in m
    r = json.loads((out / "results.json").read_text())
    assert r["downstream_random_init"]["builtin_sentiment"]["grid"] and r["timings_s"]["finetune_random_init"] > 0
    # the baseline is the untrained encoder: objective=none with the same seed scores exactly the same
    n = train(cfg_factory("objective=none", "downstream.tasks=[builtin_sentiment]", "downstream.seeds=[0,1]",
                          "logger=none", output_dir=tmp_path / "none"))
    assert n["downstream/builtin_sentiment/acc"] == pytest.approx(m["random_init/builtin_sentiment/acc"])
    # a second job of the same sweep (another mask rate, same seed and protocol) reuses the random-init row
    o = train(cfg_factory("downstream.random_init_baseline=true", "downstream.tasks=[builtin_sentiment]",
                          "downstream.seeds=[0,1]", "logger=none", "mask.rate=0.3", output_dir=tmp_path / "r30"))
    r30 = json.loads((tmp_path / "r30" / "results.json").read_text())
    assert r30["downstream_random_init"]["reused_from"].endswith("random_init.json")
    assert o["random_init/builtin_sentiment/acc"] == m["random_init/builtin_sentiment/acc"]
    assert json.loads((tmp_path / "r30" / "predictions" / "random_init.json").read_text())["builtin_sentiment"]
    q = train(cfg_factory("downstream.random_init_baseline=true", "downstream.tasks=[builtin_sentiment]",
                          "downstream.seeds=[0,1]", "logger=none", "downstream.reuse_random_init=false",
                          output_dir=tmp_path / "fresh"))
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())["downstream_random_init"]
    assert "reused_from" not in fresh and q["random_init/builtin_sentiment/acc"] == m["random_init/builtin_sentiment/acc"]


def test_unigram_reference():
    counts = torch.tensor([0, 0, 0, 0, 0, 6, 2, 2, 0])
    labels = torch.tensor([[5, -100, 6], [-100, 7, 5]])
    ref = unigram_reference(counts, labels)
    p = torch.tensor([0.6, 0.2, 0.2])
    assert ref["unigram_entropy"] == pytest.approx(float(-(p * p.log()).sum()))
    q = (counts.double() + 1) / (10 + 9)
    assert ref["unigram_loss_eval"] == pytest.approx(float(-(q[[5, 6, 7, 5]].log()).mean()))


def test_strip_html():
    assert strip_html("Great.<br /><br />Loved it &amp; <i>more</i>") == "Great. Loved it & more"
    assert strip_html("3 < 4 and 5 > 2") == "3 < 4 and 5 > 2"  # not markup


def test_strip_html_cleans_the_corpus_and_keys_the_cache(cfg_factory, tmp_path):
    from mlmlab.data.corpus import corpus_key, load_documents

    f = tmp_path / "c.txt"
    f.write_text("first<br />review\n<p></p>\nsecond review\n")
    cfg = cfg_factory("data=text_files", f"data.path={f}", "data.val_fraction=0.4", "data.strip_html=true")
    docs = load_documents(cfg.data)
    assert docs["train"] + docs["validation"] == ["first review", "second review"]  # the empty document is dropped
    plain = cfg_factory("data=text_files", f"data.path={f}", "data.val_fraction=0.4")
    assert corpus_key(cfg.data) != corpus_key(plain.data)


def test_real_en_preset_runs_on_fixture_text(cfg_factory, tmp_path):
    """experiment=real_en, debug=fast-sized: the whole preset (pre-LN, seconds budget, bf16 where supported, SST-2
    with the random-init baseline and paired gains) on a small fixture corpus."""
    if not (SHARED / "sst2").is_dir():
        pytest.skip(f"{SHARED}/sst2 is not here")
    from mlmlab.data.builtin import generate_corpus

    train_txt, val_txt = tmp_path / "train.txt", tmp_path / "val.txt"
    train_txt.write_text("\n".join(generate_corpus(300, seed=1)) + "\n")
    val_txt.write_text("\n".join(generate_corpus(30, seed=2)) + "\n")
    out = tmp_path / "run"
    m = train(cfg_factory("experiment=real_en", f"paths.data_dir={SHARED}", f"data.path={train_txt}",
                          f"data.val_path={val_txt}", "data.max_seq_len=64", "data.batch_size=16",
                          "tokenizer.vocab_size=512", "trainer.budget.seconds=2", "trainer.val_check_interval=10",
                          "downstream.seeds=[0,1]", "downstream.max_train_examples=48",
                          "downstream.max_selection_examples=16", "downstream.finetune.lr=3e-4",
                          "downstream.finetune.epochs=1", "logger=none", output_dir=out))
    r = json.loads((out / "results.json").read_text())
    assert r["config"]["model"]["norm"] == "pre" and r["config"]["model"]["dropout"] == 0.0
    assert r["budget"]["calibration"]["steps"] == m["train/steps"]
    assert {"downstream/sst2/acc", "random_init/sst2/acc", "gain/sst2/acc", "gain/sst2/acc_ci95"} <= set(m)
    assert r["data"]["unigram_entropy"] > 0 and "val/mlm_loss_r15" in m


def test_length_buckets_cover_every_item_once_with_little_padding():
    from mlmlab.downstream import LengthBucketBatches

    g = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in torch.randint(1, 60, (1000,), generator=torch.Generator().manual_seed(1))]
    batches = list(LengthBucketBatches(lengths, 32, g, pool=10))
    assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == 32
    pad = sum(max(lengths[i] for i in b) * len(b) for b in batches) - sum(lengths)
    shuffled = [list(range(1000))[i : i + 32] for i in range(0, 1000, 32)]
    pad_plain = sum(max(lengths[i] for i in b) * len(b) for b in shuffled) - sum(lengths)
    assert pad < pad_plain / 4
    again = list(LengthBucketBatches(lengths, 32, torch.Generator().manual_seed(0), pool=10))
    assert again == batches  # seeded: the fine-tuning seed fixes the order


def test_predict_logits_keeps_the_items_order():
    from mlmlab.downstream import predict_logits

    class Echo(torch.nn.Module):  # logits = (length, first id): shows which item each output belongs to
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, b):
            return torch.stack([b["attention_mask"].sum(1).float(), b["input_ids"][:, 0].float()], 1)

    items = [{"input_ids": [i + 5] * (1 + (i * 7) % 13), "token_type_ids": None, "label": 0} for i in range(40)]
    out = predict_logits(Echo(), items, batch_size=8)
    assert [(int(o[0]), int(o[1])) for o in out] == [(len(x["input_ids"]), x["input_ids"][0]) for x in items]


def test_linear_probe_is_deterministic_and_separates_a_separable_fixture():
    from mlmlab.data.tasks import TaskSpec
    from mlmlab.downstream import probe_task
    from mlmlab.models.encoder import Encoder, EncoderConfig

    c = EncoderConfig(vocab_size=20, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, norm="pre")
    torch.manual_seed(0)
    state = Encoder(c).state_dict()

    def split(n, offset):
        items = [{"input_ids": [2] + [5 + (i % 2)] * (3 + i % 4) + [3], "token_type_ids": None, "label": i % 2,
                  "doc": i - offset} for i in range(offset, offset + n)]
        return {"items": items, "labels": [i % 2 for i in range(offset, offset + n)], "n": n}

    spec = TaskSpec(name="toy", kind="single", columns=("text",))
    f = type("F", (), {"pooling": "mean"})()
    splits = {"train": split(40, 0), "test": split(20, 40)}
    a, rep = probe_task(spec, c.to_dict(), state, splits, ["neg", "pos"], f, {"precision": "32-true"})
    b, _ = probe_task(spec, c.to_dict(), state, splits, ["neg", "pos"], f, {"precision": "32-true"})
    assert a == b == {"probe/toy/acc": 1.0} and rep["C"] in rep["Cs"]


def test_protocol_both_in_a_job_and_bad_protocols_rejected(cfg_factory, tmp_path):
    m = train(cfg_factory("downstream.protocol=both", "downstream.random_init_baseline=true", "logger=none",
                          "downstream.tasks=[builtin_sentiment]", output_dir=tmp_path / "both"))
    assert {"probe/builtin_sentiment/acc", "downstream/builtin_sentiment/acc", "random_init_probe/builtin_sentiment/acc",
            "gain_probe/builtin_sentiment/acc", "gain/builtin_sentiment/acc"} <= set(m)
    p = train(cfg_factory("downstream.protocol=probe", "logger=none", "downstream.tasks=[builtin_sentiment]",
                          output_dir=tmp_path / "probe"))
    assert "downstream/builtin_sentiment/acc" not in p
    assert p["downstream/score"] == p["probe/builtin_sentiment/acc"] == m["probe/builtin_sentiment/acc"]
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory("downstream.protocol=guess"))
    assert "downstream.protocol='guess' is not known; allowed: finetune, probe, both" in str(e.value)


def test_a_resumed_seconds_budget_run_keeps_its_calibrated_step_count(cfg_factory, tmp_path):
    out = tmp_path / "run"
    first = train(cfg_factory("trainer.budget.seconds=2", "downstream=none", "logger=none", output_dir=out))
    steps = int(first["train/steps"])
    again = train(cfg_factory("trainer.budget.seconds=2", "downstream=none", "logger=none", f"resume={out}",
                              output_dir=tmp_path / "resumed"))
    r = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert r["budget"]["calibration"] == {"seconds": 2.0, "resumed": True, "steps": steps}
    assert again["train/steps"] == steps


def test_random_init_rows_are_reused_per_cpu_kind_and_protocol(cfg_factory, monkeypatch, tmp_path):
    """A second arm with the same seed, shape and protocol fine-tunes no random-init model; another CPU kind or
    another fine-tuning protocol version computes its own (the same job moves ~1 point between CPU kinds)."""
    from mlmlab import baseline, downstream, hardware

    cfg = cfg_factory(f"paths.cache_dir={tmp_path / 'cache'}")

    class Tok:
        def to_str(self):
            return "tokenizer"

    calls = []

    def compute():
        calls.append(1)
        return {"random_init/x/acc": 0.5 + 0.1 * len(calls)}, {"x": {"acc": 0.5}}

    def row(c):
        p = downstream.Protocol.of(c.paths, c.data, c.downstream)
        return baseline.cached_random_init(p, c.data, c.paths.cache_dir, "32-true", Tok(), {"hidden": 8}, 0, compute)

    first = row(cfg)
    again = row(cfg)
    assert len(calls) == 1 and again[0] == first[0] and again[2] is not None  # the second arm reused the row
    other_batch = cfg_factory(f"paths.cache_dir={tmp_path / 'cache'}", "data.batch_size=8")  # how the corpus is loaded
    assert row(other_batch)[2] is not None
    assert len(calls) == 1
    monkeypatch.setattr(hardware, "cpu_kind", lambda: "another CPU")
    row(cfg)
    assert len(calls) == 2
    monkeypatch.setattr(downstream, "PROTOCOL_VERSION", downstream.PROTOCOL_VERSION + 1)
    row(cfg)
    assert len(calls) == 3


def test_fp16_on_the_cpu_is_rejected_rather_than_recorded_as_what_did_not_run(cfg_factory):
    """Lightning switches 16-mixed to bf16 on the CPU; the record would say 16-mixed for a bf16 run."""
    from mlmlab.config import ConfigError, validate

    for p in ("16-mixed", "16"):
        with pytest.raises(ConfigError, match=f"trainer.precision={p}: fp16 is a GPU precision"):
            validate(cfg_factory(f"trainer.precision={p}", "trainer.accelerator=cpu"))
