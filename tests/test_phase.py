"""The phase of an encoder (mlmlab.phase): the unigram and bigram references of the fixed evaluation masks
(mlmlab.data.ngram), cached once per corpus/tokenizer/masks, logged beside val/mlm_loss_r15, and the declared rule."""

import json

import pytest
import torch

from mlmlab.config import ConfigError, EvalConfig, validate
from mlmlab.phase import phase


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """A trained tiny model and then a random-init job (objective=none) of the same corpus, tokenizer and eval masks,
    in a cache of their own, counting how often the n-gram statistics are counted."""
    from conftest import FAST, make_cfg

    import mlmlab.data.ngram as ngram
    from mlmlab import pretrain_job as train

    root, cache = tmp_path_factory.mktemp("phase"), tmp_path_factory.mktemp("phase_cache")
    calls = []
    count = ngram.count_ngrams
    base = [*FAST, "downstream=none", "callbacks.checkpoint=false", "logger=none"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ngram, "count_ngrams", lambda *a, **k: calls.append(1) or count(*a, **k))
        train(make_cfg(base, root / "trained", cache))
        after_first = len(calls)
        train(make_cfg([*base, "objective=none"], root / "none", cache))
    records = {k: json.loads((root / k / "results.json").read_text()) for k in ("trained", "none")}
    return records, after_first, len(calls), root, cache


def test_bigram_reference_below_unigram_on_the_builtin_corpus(cfg_factory):
    """On the built-in language the left neighbour tells a lot: the bigram reference is well below the unigram one,
    seeing the shown token or not; the Witten-Bell bigram is a distribution for every context; the unigram is the
    add-one estimate of the training counts."""
    from conftest import prepared

    from mlmlab import build_recipe
    from mlmlab.data.ngram import UNIGRAM_K, cached_reference, count_ngrams
    from mlmlab.data.tokenizer import PAD
    from mlmlab.masking.replacement import UniformSampler
    from mlmlab.pretraining import build_masking_plan

    cfg = cfg_factory()
    data = prepared(cfg)
    fixed = build_masking_plan(build_recipe(cfg.mask, data.ctx, data.train_blocks), cfg.eval, data).fixed
    ref = cached_reference(cfg.data, cfg.tokenizer, cfg.paths.cache_dir, data.tok, data.train_blocks, fixed, cfg.eval,
                           "token", data.ctx, UniformSampler(data.ctx).probs)
    assert ref["positions"] == int((fixed.labels != -100).sum()) > 0
    assert ref["bigram"] < ref["unigram"] - 1.0 and ref["bigram_blind"] < ref["unigram_blind"] - 1.0
    # what the shown token (random or kept, 20% of positions) tells only lowers the references
    assert ref["unigram"] < ref["unigram_blind"] and ref["bigram"] < ref["bigram_blind"]
    support = data.ctx.allowed().clone()
    support[data.ctx.unk_id] = True
    n = count_ngrams(data.train_blocks, data.vocab_size, support, PAD)
    counts = data.ctx.token_counts().double()
    assert torch.allclose(n.p, torch.where(support, counts + UNIGRAM_K, 0.0) / (counts.sum() + UNIGRAM_K * support.sum()))
    v = data.vocab_size
    for h in (2, 3, int(counts.argmax()), -1):  # [CLS], [SEP], the commonest token, no context
        p = n.bigram(torch.full((v,), h), torch.arange(v))
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)
        assert bool((p[support] > 0).all())


def test_reference_cache_is_reused_by_a_second_job(two_jobs):
    """The references are counted once per corpus, tokenizer and eval masks: the second job of the same data (another
    objective) reuses the first one's entry, and says so in its record."""
    records, after_first, total, _, _ = two_jobs
    assert after_first == 1 and total == 1
    first, second = (records[k]["data"]["ngram_reference"] for k in ("trained", "none"))
    assert first["reused"] is False and second["reused"] is True and first["cache"] == second["cache"]
    for r in records.values():
        assert r["metrics"]["val/unigram_loss_r15"] == first["unigram"]
        assert r["metrics"]["val/bigram_loss_r15"] == first["bigram"]


def test_phase_of_a_trained_tiny_model_follows_the_declared_rule(two_jobs):
    """results.json ``phase`` of a trained tiny model: the label the rule gives for its val/mlm_loss_r15 against the
    two references at eval.phase_margin; the untrained encoder is lexical. The W&B summary gets the label (the
    metrics reach it with every metric: mlmlab.job)."""
    from types import SimpleNamespace

    from mlmlab.phase import record_phase

    records, _, _, _, _ = two_jobs
    for name, r in records.items():
        ph, m = r["phase"], r["metrics"]
        assert ph["mlm_loss"] == m["val/mlm_loss_r15"] and ph["unigram"] == m["val/unigram_loss_r15"]
        assert ph["bigram"] == m["val/bigram_loss_r15"] and ph["margin"] == r["config"]["eval"]["phase_margin"] == 0.1
        loss, uni, bi, g = ph["mlm_loss"], ph["unigram"], ph["bigram"], ph["margin"]
        rule = "lexical" if loss >= uni - g else "past the drop" if loss < bi - g else "bigram"
        assert ph["label"] == rule == phase(loss, uni, bi, g), name
    assert records["none"]["phase"]["label"] == "lexical"  # random init: ~log V nats
    assert records["trained"]["phase"]["mlm_loss"] < records["none"]["phase"]["mlm_loss"]
    r = records["trained"]
    run, record = SimpleNamespace(summary={}), SimpleNamespace(data={"data": {}}, set=lambda **kv: None)
    out = record_phase(r["data"]["ngram_reference"], "r15", r["metrics"], 0.1, record, run)
    assert out == {k: r["metrics"][k] for k in ("val/unigram_loss_r15", "val/bigram_loss_r15")}
    assert run.summary == {"phase": r["phase"]["label"]}


def test_phase_rule_and_the_phase_of_an_old_record(two_jobs, capsys):
    """The rule at hand-made values, and ``python -m mlmlab.phase`` on a record without phase or references (as
    records made before them): recomputed from the record's config -- from the cache here -- to the job's own."""
    from mlmlab.phase import main

    assert phase(5.0, 4.0, 2.0, 0.5) == "lexical" and phase(3.5, 4.0, 2.0, 0.5) == "lexical"
    assert phase(3.4, 4.0, 2.0, 0.5) == "bigram" and phase(1.5, 4.0, 2.0, 0.5) == "bigram"
    assert phase(1.4, 4.0, 2.0, 0.5) == "past the drop" and phase(3.0, 4.0, 2.0, 0.0) == "bigram"
    with pytest.raises(ValueError):
        phase(float("nan"), 4.0, 2.0)
    records, _, _, root, cache = two_jobs
    old = json.loads(json.dumps(records["trained"]))
    del old["phase"], old["data"]["ngram_reference"], old["config"]["eval"]["phase_margin"]
    for k in ("val/unigram_loss_r15", "val/bigram_loss_r15"):
        del old["metrics"][k]
    (root / "old").mkdir()
    (root / "old" / "results.json").write_text(json.dumps(old))
    assert main([str(root / "old"), f"cache_dir={cache}"]) == 0
    line = capsys.readouterr().out.strip()
    ph = records["trained"]["phase"]
    assert line.startswith(f"{root / 'old' / 'results.json'}: {ph['label']} (val/mlm_loss_r15 {ph['mlm_loss']:.4f}, "
                           f"unigram {ph['unigram']:.4f}, bigram {ph['bigram']:.4f}, margin 0.1; references from "
                           "the cache")
    assert main([str(root / "trained"), "margin=100"]) == 0  # the record's own references, another margin
    assert ": lexical (" in capsys.readouterr().out
    out = root / "results" / "phases.json"  # write=: merged into a JSON keyed by the path relative to its folder
    out.parent.mkdir()
    assert main([str(root / "old"), f"cache_dir={cache}", f"write={out}"]) == 0
    assert main([str(root / "trained"), f"write={out}"]) == 0
    written = json.loads(out.read_text())
    assert set(written) == {"../old/results.json", "../trained/results.json"}
    assert written["../old/results.json"]["label"] == ph["label"]
    assert written["../old/results.json"]["source"] == "python -m mlmlab.phase"
    assert written["../trained/results.json"]["source"] == "recorded"


def test_a_negative_phase_margin_is_a_one_line_error_naming_the_key(cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory("eval.phase_margin=-0.1"))
    assert str(e.value).startswith("eval.phase_margin=-0.1 must be a finite number of nats >= 0")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="eval.phase_margin"):  # the owner's check, where the field is declared
        EvalConfig(phase_margin=-1.0)


def test_reach_and_loss_at_read_the_validation_curve_by_interpolation():
    from mlmlab.phase import loss_at, reach

    curve = [{"step": 100, "tokens": 1000, "train_s": 60.0, "val/mlm_loss_r15": 6.0},
             {"step": 200, "tokens": 2000, "train_s": 120.0, "val/mlm_loss_r15": 5.0},
             {"step": 300, "tokens": 3000, "train_s": 180.0, "val/mlm_loss_r15": 4.0, "final": True}]
    hit = reach(curve, 4.5)
    assert hit == pytest.approx({"step": 250, "tokens": 2500, "train_s": 150.0})
    assert reach(curve, 6.5) == {"step": 100, "tokens": 1000, "train_s": 60.0}  # the first pass already below
    assert reach(curve, 3.9) is None
    assert loss_at(curve, 90.0) == pytest.approx(5.5) and loss_at(curve, 180.0) == pytest.approx(4.0)
    assert loss_at(curve, 60.0) == pytest.approx(6.0)
    assert loss_at(curve, 30.0) is None and loss_at(curve, 181.0) is None  # outside what the job ran
