"""Selection that knows the domain: weighted selection (``mask.select.*``: idf, domain, loss) and PMI units
(``mask.unit=pmi``), tested statistically like the other axes: realized rates and what is selected."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import FAST, make_cfg

from mlmlab.data.pmi import pmi_units
from mlmlab.masking import GeneratorSource, Masker, make_generator
from mlmlab.masking.config import MaskConfig
from mlmlab.masking.replacement import SamplerContext, UniformSampler
from mlmlab.masking.selection import LossWeights, WeightTable, build_weights, domain_ratio, selection_probs

V, SPECIAL, MASK = 200, (0, 1, 2, 3, 4), 4
DOMAIN = torch.arange(100, 120)  # the "domain terms": weight R against 1 for the rest
R = 3.0


def table(r: float = R) -> WeightTable:
    w = torch.ones(V)
    w[DOMAIN] = r
    return WeightTable("test", w, SPECIAL)


def batch(b: int = 256, n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (b, n), generator=g)
    dom = torch.rand((b, n), generator=g) < 0.2  # 20% domain tokens
    ids = torch.where(dom, torch.randint(100, 120, (b, n), generator=g), ids)
    ids[:, 0], ids[:, -1] = 2, 3
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    return ids, special


def run(masker, rate: float, steps: int = 40, word_ids=None):
    sel_dom = sel_other = n_dom = n_other = 0
    per_seq = []
    for step in range(steps):
        ids, special = batch(seed=step)
        src = GeneratorSource(make_generator("cpu", 7, step), ids.shape[0], ids.device)
        out = masker(ids, special, rate, src, word_ids=word_ids)
        sel = out.labels != -100
        dom = (ids >= 100) & (ids < 120)
        sel_dom += int((sel & dom).sum())
        sel_other += int((sel & ~dom & ~special).sum())
        n_dom += int(dom.sum())
        n_other += int((~dom & ~special).sum())
        per_seq.append(sel.sum(1))
    return sel_dom, sel_other, n_dom, n_other, torch.cat(per_seq)


def masker(count: str = "bernoulli", weights=None, unit: str = "token") -> Masker:
    return Masker(MASK, MaskConfig(count=count, unit=unit), UniformSampler(SamplerContext(V, SPECIAL)), weights)


def test_selection_probs_rescale_to_the_rate_and_cap_at_one():
    w = torch.tensor([[1.0, 1.0, 1.0, 100.0, 0.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    exists = torch.tensor([[True, True, True, True, False], [True] * 5])
    p = selection_probs(w, exists, 0.5)
    torch.testing.assert_close(p.sum(1), torch.tensor([2.0, 2.5], dtype=torch.float64))
    assert p[0, 3] == 1.0 and p[0, 4] == 0.0  # the heavy unit capped, the rest share what is left
    torch.testing.assert_close(p[0, :3], torch.full((3,), 1 / 3, dtype=torch.float64))
    torch.testing.assert_close(p[1] / p[1, 0], torch.arange(1.0, 6.0, dtype=torch.float64))  # proportional, no cap
    uniform = selection_probs(torch.ones(2, 5), exists, 0.15)
    assert torch.allclose(uniform[1], torch.full((5,), 0.15, dtype=torch.float64))


def test_weighted_bernoulli_keeps_the_rate_and_selects_domain_terms_by_the_ratio():
    rate = 0.15
    d, o, nd, no, _ = run(masker(weights=table()), rate)
    n = nd + no
    realized = (d + o) / n
    # the expected rate per sequence is exactly `rate`; over ~600k candidates the realized rate is within 4 sd of it
    assert abs(realized - rate) < 4 * math.sqrt(rate * (1 - rate) / n), realized
    ratio = (d / nd) / (o / no)
    se = ratio * math.sqrt(1 / d + 1 / o)  # delta method on the log ratio of two binomial proportions
    assert abs(ratio - R) < 4 * se, (ratio, se)
    # uniform selection: the same tokens, ratio 1
    d, o, nd, no, _ = run(masker(), rate)
    assert abs((d / nd) / (o / no) - 1) < 4 * math.sqrt(1 / d + 1 / o)


def test_weighted_exact_count_keeps_the_budget_and_prefers_domain_terms():
    rate = 0.15
    d, o, nd, no, per_seq = run(masker("exact", table()), rate, steps=10)
    assert torch.all(per_seq == round(rate * 62))  # 62 candidates per sequence: the exact rule's budget, every time
    ratio = (d / nd) / (o / no)
    # without replacement the inclusion ratio is below the weight ratio, and well above 1
    assert 2.0 < ratio < R, ratio


def test_weighted_word_units_are_selected_whole():
    ids, special = batch(b=8)
    word_ids = torch.full_like(ids, -1)
    word_ids[:, 1:-1] = torch.arange(62) // 2  # two-piece words
    m = masker(weights=table(), unit="word")
    out = m(ids, special, 0.3, GeneratorSource(make_generator("cpu", 1), 8, ids.device), word_ids=word_ids)
    sel = (out.labels != -100)[:, 1:-1].reshape(8, 31, 2)
    assert torch.equal(sel[..., 0], sel[..., 1]) and sel.any()


def test_weight_tables_from_corpus_statistics():
    ctx_counts = {"dom": torch.zeros(V, dtype=torch.long), "ref": torch.zeros(V, dtype=torch.long)}
    ctx_counts["dom"][5:100] = 10
    ctx_counts["dom"][DOMAIN] = 100
    ctx_counts["ref"][5:120] = 10
    ctx = SamplerContext(V, SPECIAL, token_counts=lambda: ctx_counts["dom"],
                         corpus_counts=lambda p, key="": ctx_counts[p],
                         doc_freq=lambda: (torch.cat([torch.zeros(5), torch.full((V - 5,), 50.0)]).long()
                                           .index_fill(0, DOMAIN, 2), 100))
    dom = build_weights(MaskConfig(select={"weight": "domain", "reference": "ref"}).select, ctx)
    w = dom.table("cpu")
    assert torch.all(w[list(SPECIAL)] == 0) and w[DOMAIN].min() > 5 * w[5:100].max()
    torch.testing.assert_close(w.double(), domain_ratio(ctx_counts["dom"], ctx_counts["ref"], ctx.allowed()).index_fill(
        0, torch.tensor(SPECIAL), 0.0), check_dtype=False)
    idf = build_weights(MaskConfig(select={"weight": "idf"}).select, ctx).table("cpu")
    assert idf[DOMAIN].min() > idf[5:100].max()  # rarer in the blocks: a larger weight
    assert build_weights(MaskConfig().select, ctx) is None
    flat = build_weights(MaskConfig(select={"weight": "idf", "power": 0.0}).select, ctx).table("cpu")
    assert torch.all(flat[5:] == 1)  # power 0: uniform


def test_loss_weights_follow_the_models_losses_and_travel_in_a_checkpoint():
    lw = LossWeights(V, SPECIAL, decay=0.5)
    start = lw.table("cpu")[10].item()
    assert start == pytest.approx(math.log(V)) and lw.table("cpu")[0] == 0
    lw.update(torch.tensor([10, 10, 11]), torch.tensor([1.0, 3.0, 9.0]))
    assert lw.loss[10] == pytest.approx(0.5 * math.log(V) + 0.5 * 2.0)
    assert lw.loss[11] == pytest.approx(0.5 * math.log(V) + 0.5 * 9.0) and lw.loss[12] == pytest.approx(math.log(V))
    again = LossWeights(V, SPECIAL, decay=0.5)
    again.load(lw.state())
    assert torch.equal(again.table("cpu"), lw.table("cpu")) and again.updates == 1


def test_bad_selection_settings_fail_with_the_key(cfg_factory):
    from mlmlab.config import ConfigError, validate

    for over, msg in ((["mask.select.weight=tfidf"], "mask.select.weight='tfidf' is not known; allowed: uniform"),
                      (["mask.select.weight=domain"], "mask.select.weight=domain compares"),
                      (["mask.select.weight=idf", "mask.unit=span"], "with mask.unit=span is not supported"),
                      (["mask.select.weight=loss", "objective=electra"], "objective=mlm only"),
                      (["mask.select.weight=domain", "mask.select.reference=/nope.txt"], "mask.select.reference"),
                      (["mask.pmi.max_n=7", "mask.unit=pmi"], "mask.pmi.max_n=7 must be in 2..5")):
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            validate(cfg_factory(*over))


def _pmi_corpus(n: int = 3000, length: int = 32, seed: int = 0):
    """Single-piece words 10..99 drawn uniformly, with the collocation (50, 51) at 5% and (60, 61, 62) at 3% of
    positions; a [SEP] in the middle of every block (two documents)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, length), np.int32)
    wid = np.full((n, length), -1, np.int32)
    for b in range(n):
        toks = [2]
        while len(toks) < length - 1:
            r = rng.random()
            toks += [50, 51] if r < 0.05 else [60, 61, 62] if r < 0.08 else [int(rng.integers(10, 100))]
        toks = toks[: length - 1] + [3]
        toks[length // 2] = 3
        ids[b] = toks
        words = np.arange(length) - 1
        wid[b] = np.where(np.isin(ids[b], [2, 3]), -1, words)
    return ids, wid


def test_pmi_units_merge_collocations_and_never_cross_a_document():
    ids, wid = _pmi_corpus()
    out, report = pmi_units(ids, wid, max_n=5, min_count=5, top_k=4)
    # the planted collocations: 60 61 62 and its two bigrams (each ~ -log p(word) above independence), then 50 51;
    # the random bigrams (~10 occurrences each) score near 0
    assert report["ngrams_in_table"] == 4 and report["table_by_n"] == {2: 3, 3: 1}
    pos_50 = (ids[:, :-1] == 50) & (ids[:, 1:] == 51)
    b, i = np.nonzero(pos_50)
    assert len(b) > 1000 and np.all(out[b, i] == out[b, i + 1])  # "50 51" is always one unit
    other = (ids[:, :-1] != 50) & (ids[:, :-1] >= 10) & (ids[:, 1:] >= 10) & (ids[:, 1:] < 50)
    b, i = np.nonzero(other)
    assert np.all(out[b, i] != out[b, i + 1])  # ordinary neighbours stay apart
    mid = ids.shape[1] // 2
    assert np.all(out[:, mid] == -1) and np.all(out[:, mid - 1] != out[:, mid + 1])  # not across the [SEP]
    b, i = np.nonzero((ids[:, :-2] == 60) & (ids[:, 1:-1] == 61) & (ids[:, 2:] == 62))
    assert len(b) > 500 and np.all(out[b, i] == out[b, i + 2])  # the trigram merged whole (longest first)
    valid = out >= 0
    assert np.all((np.diff(np.where(valid, out, 0), axis=1) >= 0) | ~valid[:, 1:] | ~valid[:, :-1])
    assert np.all(out[valid] < ids.shape[1])  # unit slots fit the block (the masker scatters into them)


def test_pmi_masking_selects_whole_units_at_the_rate():
    ids, wid = _pmi_corpus(n=512)
    out, _ = pmi_units(ids, wid, top_k=4)
    ids_t, word_ids = torch.from_numpy(ids).long(), torch.from_numpy(out).long()
    special = torch.from_numpy(np.isin(ids, [2, 3]))
    m = masker(unit="pmi", count="exact")
    res = m(ids_t, special, 0.15, GeneratorSource(make_generator("cpu", 3), len(ids), ids_t.device), word_ids=word_ids)
    sel = res.labels != -100
    b, i = np.nonzero((ids[:, :-1] == 50) & (ids[:, 1:] == 51))
    assert torch.equal(sel[b, i], sel[b, i + 1])  # the collocation is selected whole or not at all
    n_cand = (~special).sum(1).double()
    budget = torch.floor(0.15 * n_cand + 0.5)  # the exact rule: round(rate x candidates) tokens per sequence
    assert abs(sel.sum().item() - budget.sum().item()) / n_cand.sum().item() < 0.01  # up to half a unit per sequence


@pytest.mark.parametrize("over", [["mask.select.weight=idf"], ["mask.select.weight=loss", "mask.count=exact"],
                                  ["mask.unit=pmi", "mask.pmi.min_count=2"]])
def test_selection_axes_run_in_a_job(over, tmp_path, cache_dir):
    from mlmlab.train import train

    cfg = make_cfg([*FAST, *over, "logger=none", "downstream.tasks=[]"], tmp_path / "run", cache_dir)
    m = train(cfg)
    assert abs(m["train/selected_frac"] - 0.15) < 0.03
    rec = json.loads((tmp_path / "run" / "results.json").read_text())
    if "mask.unit=pmi" in over:
        assert rec["pmi_units"]["ngrams_in_table"] > 0 and rec["pmi_units"]["share_of_words_in_pmi_units"] > 0
    if "mask.select.weight=idf" in over:
        assert rec["masking"]["select"]["weight"] == "idf" and rec["masking"]["select"]["idf_max"] > 1
    if "mask.select.weight=loss" in over:
        ck = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
        assert ck["mlmlab_select"]["updates"] == 20
