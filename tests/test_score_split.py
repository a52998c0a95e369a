"""downstream.score_split=selection: a screen scores the task's selection split (a fixed part held out of train,
mlmlab.data.tasks.hold_out), never the reported split; the held-out part is never trained on, label budgets come from
the rest of train, and the record says which split was scored."""

from __future__ import annotations

import json

import pytest

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate
from mlmlab.data.tasks import TASKS, TaskSource, hold_out

QUICK = ["trainer.max_steps=5", "trainer.val_check_interval=5", "logger=none", "callbacks.checkpoint=false",
         "downstream.tasks=[builtin_sentiment]", "downstream.seeds=[0]"]


def test_a_screen_scores_the_selection_split_and_never_trains_on_it(cfg_factory, tmp_path, monkeypatch):
    import mlmlab.downstream.protocol as protocol

    seen: list[tuple[str, list[dict]]] = []  # (the split's role, its records) for every split the jobs encode
    encode = protocol.encode_split

    def spy(tok, spec, records, f):
        seen.append((spec.name, records))
        return encode(tok, spec, records, f)

    monkeypatch.setattr(protocol, "encode_split", spy)
    out = tmp_path / "run"
    m = train(cfg_factory(*QUICK, "downstream.score_split=selection", "downstream.max_train_examples=[16]",
                          "downstream.random_init_baseline=true", output_dir=out))
    cfg = cfg_factory(*QUICK)
    data = TASKS["builtin_sentiment"].load(TaskSource.of(cfg.paths, cfg.data, cfg.downstream))
    rest, held = hold_out(data["train"], cfg.downstream.val_fraction)
    rec = json.loads((out / "results.json").read_text())
    for arm in ("downstream", "downstream_random_init"):  # the pretrained encoder and random init: the same split
        r = rec[arm]["builtin_sentiment@16"]
        assert r["reported_split"] == f"selection (held out of train, n={len(held)})", arm
        assert r["n"] == {"train": 16, "selection": len(held)}
    assert {"downstream/builtin_sentiment@16/acc", "gain/builtin_sentiment@16/acc"} <= set(m)
    held_ids = {id(r) for r in held}
    trained = [records for _, records in seen if records and id(records[0]) not in held_ids]
    scored = [records for _, records in seen if records and id(records[0]) in held_ids]
    assert scored and all(records == held for records in scored)  # the held-out part is what was scored ...
    assert trained and all(not held_ids & {id(r) for r in records} for records in trained)  # ... never trained on
    assert all(records == rest[:16] for records in trained)  # the budget: the first 16 of the rest of train
    assert not any(records == data["test"] for _, records in seen)  # the reported split is never touched


def test_the_reported_split_stays_the_default(cfg_factory, tmp_path):
    out = tmp_path / "run"
    cfg = cfg_factory(*QUICK, "downstream.max_train_examples=[16]", output_dir=out)
    train(cfg)
    r = json.loads((out / "results.json").read_text())["downstream"]["builtin_sentiment@16"]
    assert r["reported_split"] == "test" and r["n"] == {"train": 16, "test": cfg.downstream.builtin_n_test}


def test_a_budget_counts_the_train_split_less_the_held_out_part(cfg_factory, tmp_path):
    # a budget that fits the train split but not what a screen may train on (train less the held-out part)
    n = cfg_factory(*QUICK).downstream.builtin_n_train
    rest = n - max(1, round(0.1 * n))
    train(cfg_factory(*QUICK, f"downstream.max_train_examples=[{rest + 1}]", "trainer.max_steps=1",
                      output_dir=tmp_path / "fits"))
    with pytest.raises(ConfigError) as e:
        train(cfg_factory(*QUICK, "downstream.score_split=selection", f"downstream.max_train_examples=[{rest + 1}]",
                          output_dir=tmp_path / "big"))
    assert (f"downstream.max_train_examples: {rest + 1} for task builtin_sentiment is more than its {rest} training "
            "examples (after the selection split held out of train)") in str(e.value)


def test_an_unknown_score_split_fails_with_the_key_and_the_values(cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory("downstream.score_split=dev"))
    msg = str(e.value)
    assert msg.startswith("downstream.score_split='dev' is not known; allowed: reported, selection") and "\n" not in msg


def test_a_cached_random_init_row_is_never_reused_across_score_splits(cfg_factory, tmp_path):
    from mlmlab import baseline, downstream

    class Tok:
        def to_str(self):
            return "tokenizer"

    calls = []

    def compute():
        calls.append(1)
        return {"random_init/x/acc": 0.5}, {"x": {"acc": 0.5}}

    def row(*over):
        c = cfg_factory(f"paths.cache_dir={tmp_path / 'cache'}", *over)
        p = downstream.Protocol.of(c.paths, c.data, c.downstream)
        return baseline.cached_random_init(p, c.data, c.paths.cache_dir, "32-true", Tok(), {"hidden": 8}, 0, compute)

    row()
    assert row("downstream.score_split=reported")[2] is not None and len(calls) == 1  # the default: the same row
    assert row("downstream.score_split=selection")[2] is None and len(calls) == 2  # a screen's row is its own


def phrases_of(sentence: str) -> list[str]:
    """Every run of consecutive words: the phrases a treebank split like SST-2's train holds for one sentence."""
    w = sentence.split()
    return [" ".join(w[a:b]) for a in range(len(w)) for b in range(a + 1, len(w) + 1)]


def inside(text: str, other: str) -> bool:
    return f" {text} " in f" {other} "


def test_a_phrase_task_is_held_out_by_sentence():
    """SST-2 (phrases: true): the selection split is whole sentences; no held-out sentence occurs inside a training
    example; a phrase stays in train when a training sentence holds it and leaves when only held-out ones do."""
    sentences = [f"the film {adj} and the plot {i} is thin" for i, adj in enumerate(["shines", "drags", "works",
                                                                                  "bores", "soars", "sags"])]
    sentences += ["a quiet and moving story", "moving story"]  # the second is a phrase of the first, not a sentence
    rows = [{"text": p, "label": k % 2} for k, p in enumerate(dict.fromkeys(q for s in sentences for q in phrases_of(s)))]
    rows.append(dict(rows[0]))  # a duplicate phrase
    train, held = hold_out(rows, 0.34, phrases=True)
    roots = [s for s in sentences if s != "moving story"]
    assert len(held) == round(0.34 * len(roots)) and all(r["text"] in roots for r in held)
    assert not any(inside(h["text"], t["text"]) for h in held for t in train)  # no held-out text is trained on
    kept_roots = [s for s in roots if s not in {h["text"] for h in held}]
    assert {t["text"] for t in train} == {p for s in kept_roots for p in phrases_of(s)}  # every phrase of a kept one
    assert "the film" in {t["text"] for t in train}  # shared by every sentence: stays
    again = hold_out(list(rows), 0.34, phrases=True)  # seeded: the same split from an equal list
    assert [r["text"] for r in again[1]] == [r["text"] for r in held]
    rest, part = hold_out(rows, 0.34)  # without phrases: a random part, which shares its text with the rest
    assert any(inside(h["text"], t["text"]) for h in part for t in rest)


@pytest.mark.slow
def test_sst2_selection_split_holds_whole_sentences_unseen_in_training(cfg_factory):
    """On the real SST-2 (../shared/data): about a tenth of its ~6,900 sentences held out, none of them (nor any
    held-out example of >= 4 words) inside a training phrase; GLUE dev's 872 sentences are comparable in number."""
    from conftest import SHARED

    spec = TASKS["sst2"]
    if not (SHARED / spec.local).is_dir():
        pytest.skip(f"{SHARED / spec.local} is not here")
    c = cfg_factory(f"paths.data_dir={SHARED}")
    data = spec.load(TaskSource.of(c.paths, c.data, c.downstream))
    train, held = hold_out(data["train"], c.downstream.val_fraction, phrases=True)
    assert spec.phrases and 600 <= len(held) <= 800 and 55_000 <= len(train) <= 66_000
    corpus = "\n".join(f" {r['text']} " for r in train)
    assert not any(f" {r['text']} " in corpus for r in held if len(r["text"].split()) >= 4)
