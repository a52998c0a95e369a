"""Zero-shot minimal pairs (BLiMP): PLL and CLM scores against hand-computed values, ties and [UNK] counting, the exact
McNemar test, the task loader's errors, and a tiny job with downstream.tasks=[blimp, ...] end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers

from mlmlab import pretrain_job as train
from mlmlab import zeroshot as zs
from mlmlab.config import ConfigError, validate
from mlmlab.data.tasks import TASKS, TaskSource
from mlmlab.data.tokenizer import CLS, MASK, SEP
from mlmlab.downstream import subsample_pairs
from mlmlab.models.encoder import BertForMLM, CausalLM, EncoderConfig

VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "the": 5, "cat": 6, "sat": 7, "un": 8,
         "##happy": 9, "dog": 10, "##s": 11}


def toy_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def tiny(causal: bool = False):
    torch.manual_seed(0)
    c = EncoderConfig(vocab_size=len(VOCAB), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      norm="pre", causal=causal)
    return (CausalLM(c) if causal else BertForMLM(c)).eval()


def hand_pll(model, ids: list[int], masked_sets: list[list[int]]) -> float:
    """Sum over tokens i of log p(ids[i] | the input with the positions of masked_sets[i] masked), one dense forward
    each (positions count from the first real token)."""
    total = 0.0
    for i, positions in enumerate(masked_sets):
        x = [CLS, *ids, SEP]
        for p in positions:
            x[p + 1] = MASK
        with torch.no_grad():
            logits = model(torch.tensor([x]))[0, i + 1]
        total += float(F.log_softmax(logits.float(), -1)[ids[i]])
    return total


def test_pll_both_variants_match_a_hand_computation():
    model, tok = tiny(), toy_tokenizer()
    # "the unhappy cats": the, un, ##happy, cat, ##s -> words 0, 1, 1, 2, 2
    ids = [5, 8, 9, 6, 11]
    assert tok.encode("the unhappy cats", add_special_tokens=False).ids == ids
    original = hand_pll(model, ids, [[0], [1], [2], [3], [4]])
    l2r = hand_pll(model, ids, [[0], [1, 2], [2], [3, 4], [4]])  # later pieces of the same word masked too
    assert original != pytest.approx(l2r)
    got_o, got_w = (zs.pll_scores(model, tok, ["the unhappy cats", "the cat sat"], v)[0]
                    for v in ("original", "within_word_l2r"))
    assert got_o == pytest.approx(original, abs=1e-4)
    assert got_w == pytest.approx(l2r, abs=1e-4)
    # batching does not change a sentence's score
    assert zs.pll_scores(model, tok, ["the unhappy cats"], "within_word_l2r", batch_size=2)[0] == pytest.approx(l2r, abs=1e-4)


def test_clm_score_is_the_summed_next_token_log_probability():
    model, tok = tiny(causal=True), toy_tokenizer()
    x = [CLS, 5, 6, 7, SEP]
    with torch.no_grad():
        lp = F.log_softmax(model.cls(model.bert(torch.tensor([x])))[0].float(), -1)
    want = sum(float(lp[i, x[i + 1]]) for i in range(len(x) - 1))
    got = zs.clm_scores(model, tok, ["the cat sat", "the dog"])
    assert got[0] == pytest.approx(want, abs=1e-4) and zs.lm_kind(model) == "clm"


def test_ties_unk_pairs_and_summary():
    tok = toy_tokenizer()
    pairs = [{"good": "the cat sat", "bad": "the cat sat", "paradigm": "a", "field": "syntax"},  # identical: a tie
             {"good": "the cat", "bad": "cat the", "paradigm": "a", "field": "syntax"},
             {"good": "the zebra", "bad": "zebra the", "paradigm": "b", "field": "semantics"}]  # zebra -> [UNK]
    right = zs.judge([-1.0, -2.0, -5.0], [-1.5, -3.0, -4.0], pairs)
    assert right == [None, 1, 0]
    s = zs.summarize(pairs, right)
    assert s["ties"] == 1 and s["paradigms"] == {"a": 1.0, "b": 0.0} and s["acc"] == 0.5
    assert s["fields"] == {"semantics": 0.0, "syntax": 1.0}
    assert zs.unk_pairs(tok, pairs) == 1


def test_unigram_floor_prefers_frequent_tokens():
    tok = toy_tokenizer()
    counts = torch.zeros(len(VOCAB))
    counts[5], counts[6], counts[10] = 100, 50, 1
    good, bad = zs.unigram_scores(counts, tok, ["the cat", "the dog"])
    assert good > bad
    assert good == pytest.approx(math.log(101 / (151 + len(VOCAB))) + math.log(51 / (151 + len(VOCAB))))


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs():
    a = [1] * 8 + [0] * 2 + [1] * 5 + [None]
    b = [0] * 8 + [1] * 2 + [1] * 5 + [0]
    t = zs.mcnemar(a, b)
    assert (t["a_only"], t["b_only"]) == (8, 2)
    assert t["p"] == pytest.approx(2 * (45 + 10 + 1) / 1024)  # two-sided exact p for 8 of 10
    assert zs.mcnemar([1, 0], [1, 0])["p"] == 1.0


def test_subsample_is_fixed_and_per_paradigm():
    pairs = [{"paradigm": p, "i": i} for p in ("a", "b") for i in range(10)]
    s1, s2 = subsample_pairs(pairs, 3), subsample_pairs(pairs, 3)
    assert s1 == s2 and len(s1) == 6 and sum(p["paradigm"] == "a" for p in s1) == 3
    assert subsample_pairs(pairs, None) == pairs and subsample_pairs(pairs, 50) == pairs


def fixture_blimp(root, n: int = 3, skip: tuple[str, ...] = (), bad_line: str | None = None):
    """A BLiMP-shaped folder: every paradigm of the task with ``n`` pairs (word-order swaps of built-in sentences)."""
    from mlmlab.data.builtin import generate_corpus

    d = root / "blimp"
    d.mkdir(parents=True)
    sents = generate_corpus(n, seed=3)
    for par in TASKS["blimp"].paradigms:
        if par in skip:
            continue
        rows = []
        for i, s in enumerate(sents):
            w = s.split()[:8]
            rows.append(json.dumps({"sentence_good": " ".join(w), "sentence_bad": " ".join(w[1:2] + w[:1] + w[2:]),
                                    "field": "syntax" if i % 2 else "morphology", "UID": par, "pairID": str(i)}))
        if par == bad_line:
            rows.insert(1, "{not json")
        (d / f"{par}.jsonl").write_text("\n".join(rows) + "\n")
    return root


def test_blimp_task_errors_name_the_missing_paradigms_and_the_bad_line(cfg_factory, tmp_path):
    root = fixture_blimp(tmp_path / "a", skip=("passive_1", "wh_island"))
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory("downstream.tasks=[blimp]", f"paths.data_dir={root}"))
    assert "2 of the 67 paradigms" in str(e.value) and "passive_1.jsonl" in str(e.value)
    assert "wh_island.jsonl" in str(e.value)
    root = fixture_blimp(tmp_path / "b", bad_line="causative")
    cfg = cfg_factory("downstream.tasks=[blimp]", f"paths.data_dir={root}")
    with pytest.raises(ConfigError) as e:
        TASKS["blimp"].load(TaskSource.of(cfg.paths, cfg.data, cfg.downstream))
    assert "causative.jsonl, line 2: not valid JSON" in str(e.value)


@pytest.mark.parametrize("override,message", [
    ("downstream.zeroshot.n_per_paradigm=0", "downstream.zeroshot.n_per_paradigm=0 must be >= 1 or null"),
    ("downstream.zeroshot.pll=guess", "downstream.zeroshot.pll='guess' is not known; allowed: within_word_l2r, original"),
    ("downstream.zeroshot.batch_size=0", "downstream.zeroshot.batch_size=0 must be >= 1"),
])
def test_bad_zeroshot_keys_rejected(override, message, cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory(override))
    assert message in str(e.value)


def test_blimp_in_a_job_with_probe_finetune_and_the_random_init_floor(cfg_factory, tmp_path):
    root = fixture_blimp(tmp_path / "data", n=4)
    out = tmp_path / "run"
    m = train(cfg_factory("downstream.tasks=[blimp,builtin_sentiment]", "downstream.protocol=both",
                          "downstream.random_init_baseline=true", f"paths.data_dir={root}",
                          "downstream.zeroshot.n_per_paradigm=2", "logger=none", output_dir=out))
    for k in ("downstream/blimp/acc", "random_init/blimp/acc", "unigram/blimp/acc", "gain/blimp/acc",
              "gain/blimp/acc_p", "downstream/blimp/field/syntax/acc", "downstream/blimp/paradigm/passive_1/acc",
              "probe/builtin_sentiment/acc", "gain/builtin_sentiment/acc"):
        assert k in m, k
    assert m["gain/blimp/acc"] == pytest.approx(m["downstream/blimp/acc"] - m["random_init/blimp/acc"])
    r = json.loads((out / "results.json").read_text())["downstream"]["blimp"]
    assert r["pairs"] == 134 and r["scorer"] == "pseudo-log-likelihood, within_word_l2r" and r["unk_pairs"] >= 0
    assert r["vs_random_init"]["p"] == m["gain/blimp/acc_p"] and "predictions" not in r
    items = json.loads((out / "predictions" / "pretrained.json").read_text())["blimp"]["items"]
    assert len(items) == 134 and set(items) <= set("01-")
    right = [int(c) for c in items if c != "-"]
    assert len(right) > 0


def test_curves_over_pretraining_log_blimp_and_probe_at_steps(cfg_factory, tmp_path):
    root = fixture_blimp(tmp_path / "data", n=3)
    out = tmp_path / "run"
    m = train(cfg_factory("downstream.tasks=[blimp,builtin_sentiment]", "downstream.protocol=probe",
                          f"paths.data_dir={root}", "eval.zeroshot_every_n_steps=10", "eval.zeroshot_n_per_paradigm=1",
                          "trainer.max_steps=20", "logger=none", output_dir=out))
    curves = json.loads((out / "results.json").read_text())["curves"]
    assert [r["step"] for r in curves] == [0, 10, 20]
    assert all({"curve/blimp/acc", "curve/probe/builtin_sentiment/acc"} <= set(r) for r in curves)
    assert "probe/builtin_sentiment/acc" in m
    with pytest.raises(ConfigError, match=r"eval.zeroshot_every_n_steps=0 must be >= 1 or null"):
        validate(cfg_factory("eval.zeroshot_every_n_steps=0"))


def test_the_shared_blimp_folder_loads_whole(cfg_factory):
    from conftest import SHARED

    if not (SHARED / "blimp").is_dir():
        pytest.skip(f"{SHARED}/blimp is not here")
    c = cfg_factory(f"paths.data_dir={SHARED}")
    pairs = TASKS["blimp"].load(TaskSource.of(c.paths, c.data, c.downstream))["pairs"]
    assert len(pairs) == 67_000 and len({p["paradigm"] for p in pairs}) == 67
    same = sorted((p["paradigm"], p["pair_id"]) for p in pairs if p["good"] == p["bad"])
    assert same == [("passive_1", "324"), ("passive_1", "810"), ("principle_A_case_2", "105"),
                    ("principle_A_case_2", "287"), ("principle_A_case_2", "372"), ("principle_A_case_2", "816"),
                    ("principle_A_case_2", "967")]
    assert len(subsample_pairs(pairs, 100)) == 6_700
