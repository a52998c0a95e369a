"""Masking statistics and contracts for every axis: tolerances are binomial (k sigma), not magic numbers.

Axes: count rule, min_per_seq, corruption vs prediction rate, replacement ratios, units (token / word / span), static
vs dynamic sources, schedules. Property-based tests cover the invariants on random shapes and settings.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlmlab.masking import (
    Constant,
    Cosine,
    GeneratorSource,
    KeyedSource,
    Linear,
    Masker,
    Piecewise,
    Step,
    make_generator,
    mask_once,
    mask_seed,
    telemetry,
)
from mlmlab.masking.config import MaskConfig, ReplaceConfig, SpanConfig
from mlmlab.masking.masker import IGNORE_INDEX, KEPT, MASKED, PREDICT_ONLY, RANDOM, BertMasker, splitmix64
from mlmlab.masking.replacement import SamplerContext, UniformSampler

V, MASK_ID = 1000, 4
SIGMAS = 5.0  # two-sided 5-sigma bounds: a correct implementation fails with probability < 1e-6 per check


def masker(*ratios, sampler=None, span_p=0.2, span_min=1, span_max=10, **kw) -> Masker:
    """A Masker from ``mask.*`` fields (its one owner, MaskConfig): [MASK]/random/keep ratios, then any other field."""
    return Masker(MASK_ID, MaskConfig(replace=ReplaceConfig(*ratios), span=SpanConfig(span_p, span_min, span_max), **kw),
                  sampler)


def uniform(v=V):
    return UniformSampler(SamplerContext(vocab_size=v, special_ids=tuple(range(5))))


def src(b, *parts):
    return GeneratorSource(make_generator("cpu", *parts), b, torch.device("cpu"))


def batch(b=64, t=128, max_word=3, seed=0):
    """Random ids with [CLS]/[SEP]/padding and word ids (words of 1..max_word pieces)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    pad = min(28, max(0, t - 3))
    if pad:
        ids[::3, t - pad :] = 0  # padded tails
        ids[::3, t - pad - 1] = 3
    special = ids < 5
    starts = torch.rand((b, t), generator=g) < 1.0 / ((max_word + 1) / 2)
    new_word = (starts | torch.roll(special, 1, 1)) & ~special
    word_ids = (new_word.long().cumsum(1) - 1).masked_fill(special, -1)
    return ids, special, word_ids


def within(count, n, p, sigmas=SIGMAS):
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


def word_spans(word_ids):
    """[(row, word, tensor of positions)] for every word."""
    out = []
    for r in range(word_ids.shape[0]):
        for w in word_ids[r][word_ids[r] >= 0].unique().tolist():
            out.append((r, w, (word_ids[r] == w).nonzero()[:, 0]))
    return out


# ---------------------------------------------------------------------------------------------- rate and split


@pytest.mark.parametrize("rate", [0.05, 0.15, 0.4])
@pytest.mark.parametrize("ratios", [(0.8, 0.1, 0.1), (0.5, 0.3, 0.2), (1.0, 0.0, 0.0), (0.0, 0.2, 0.8)])
def test_rates_and_split_within_binomial_bounds(rate, ratios):
    ids, special, _ = batch()
    m = BertMasker(MASK_ID, *ratios, sampler=uniform())
    out = m(ids, special, rate, src(len(ids), 0, 0, 0, 0))
    sel = out.kind != 0
    n_el, n_sel = int((~special).sum()), int(sel.sum())
    assert within(n_sel, n_el, rate)
    for kind, p in zip((MASKED, RANDOM, KEPT), ratios):
        c = int((out.kind == kind).sum())
        assert (c == 0) if p == 0 else within(c, n_sel, p), (kind, c, n_sel, p)
    assert not (sel & special).any()  # specials and padding never selected
    assert torch.equal(out.labels[sel], ids[sel]) and (out.labels[~sel] == IGNORE_INDEX).all()
    assert torch.equal(out.input_ids[~sel], ids[~sel])
    assert torch.equal(out.input_ids[out.kind == KEPT], ids[out.kind == KEPT])
    assert (out.input_ids[out.kind == MASKED] == MASK_ID).all()
    assert (out.input_ids[out.kind == RANDOM] >= 5).all()
    t = telemetry(ids, special, out)
    assert t["special_selected"] == 0 and t["selected_frac"] == pytest.approx(n_sel / n_el)


def test_realized_rate_over_1e5_candidates():
    ids, special, _ = batch(b=1024, t=128)
    n_el = int((~special).sum())
    assert n_el > 1e5
    out = masker(sampler=uniform())(ids, special, 0.15, src(len(ids), 3))
    assert within(int((out.labels != IGNORE_INDEX).sum()), n_el, 0.15)


# ------------------------------------------------------------------------------------------------- count rules


def test_exact_count_per_sequence():
    ids, special, _ = batch()
    for rate in (0.1, 0.15, 0.33):
        out = masker(sampler=uniform(), count="exact")(ids, special, rate, src(len(ids), 1))
        n_cand = (~special).sum(1).double()
        expected = torch.clamp(torch.floor(rate * n_cand + 0.5), min=1).long()
        assert torch.equal((out.labels != IGNORE_INDEX).sum(1), expected)


def test_prob_round_mean_count():
    ids, special, _ = batch(b=2000, t=40)
    rate = 0.13
    out = masker(sampler=uniform(), count="prob_round")(ids, special, rate, src(len(ids), 2))
    n_cand = (~special).sum(1).double()
    counts = (out.labels != IGNORE_INDEX).sum(1).double()
    x = rate * n_cand
    assert ((counts == torch.floor(x)) | (counts == torch.ceil(x)) | (counts == 1)).all()
    frac = x - torch.floor(x)
    # mean count: sum of independent Bernoulli(frac) on top of the floors
    sd = math.sqrt(float((frac * (1 - frac)).sum()))
    assert abs(float(counts.sum() - x.sum())) <= SIGMAS * sd + 1


def test_min_per_seq_never_leaves_a_sequence_without_target():
    ids = torch.full((500, 6), 7)
    ids[:, 0], ids[:, -1] = 2, 3
    special = ids < 5  # 4 candidates: 0.05 * 4 rounds to 0
    for count in ("exact", "prob_round"):
        out = masker(sampler=uniform(), count=count)(ids, special, 0.05, src(500, 4))
        assert ((out.labels != IGNORE_INDEX).sum(1) >= 1).all()
    out = masker(sampler=uniform(), count="bernoulli")(ids, special, 0.05, src(500, 4))
    assert telemetry(ids, special, out)["zero_target_seqs"] > 0.5  # HF behaviour: many sequences without targets
    out = masker(sampler=uniform(), count="bernoulli", min_per_seq=2)(ids, special, 0.05, src(500, 4))
    assert ((out.labels != IGNORE_INDEX).sum(1) >= 2).all()


# -------------------------------------------------------------------------------- corruption vs prediction rate


def test_predict_rate_above_corruption_rate():
    ids, special, _ = batch(b=256)
    n_el = int((~special).sum())
    out = masker(sampler=uniform(), predict_rate=0.4)(ids, special, 0.15, src(len(ids), 5))
    predicted = out.labels != IGNORE_INDEX
    corrupted = (out.kind == MASKED) | (out.kind == RANDOM) | (out.kind == KEPT)
    assert within(int(predicted.sum()), n_el, 0.4)
    assert within(int(corrupted.sum()), n_el, 0.15)
    assert not (corrupted & ~predicted).any()
    po = out.kind == PREDICT_ONLY
    assert po.any() and torch.equal(out.input_ids[po], ids[po]) and torch.equal(out.labels[po], ids[po])


def test_predict_rate_below_corruption_rate():
    ids, special, _ = batch(b=256)
    n_el = int((~special).sum())
    out = masker(sampler=uniform(), predict_rate=0.1)(ids, special, 0.4, src(len(ids), 6))
    predicted = out.labels != IGNORE_INDEX
    corrupted = out.kind != 0
    assert within(int(predicted.sum()), n_el, 0.1) and within(int(corrupted.sum()), n_el, 0.4)
    assert not (predicted & ~corrupted).any()
    assert ((out.kind == MASKED) & ~predicted).any()  # corrupted, not predicted


# -------------------------------------------------------------------------------------------------------- units


@pytest.mark.parametrize("unit", ["word", "span"])
@pytest.mark.parametrize("count", ["bernoulli", "exact"])
def test_units_never_split_a_word(unit, count):
    ids, special, wids = batch(b=32, t=96)
    m = masker(sampler=uniform(), unit=unit, count=count)
    out = m(ids, special, 0.2, src(len(ids), 7), word_ids=wids)
    for r, _, pos in word_spans(wids):
        kinds = out.kind[r, pos]
        assert (kinds == kinds[0]).all()  # one decision per word: all [MASK], all random, all kept, or untouched
    assert not ((out.kind != 0) & special).any()


def test_word_unit_bernoulli_selects_words_at_rate():
    ids, special, wids = batch(b=256, t=128)
    out = masker(sampler=uniform(), unit="word")(ids, special, 0.15, src(len(ids), 8), word_ids=wids)
    words = word_spans(wids)
    n_sel = sum(int(out.labels[r, pos[0]] != IGNORE_INDEX) for r, _, pos in words)
    assert within(n_sel, len(words), 0.15)


@pytest.mark.parametrize("unit,max_words_per_unit", [("word", 1), ("span", 10)])
def test_budget_respected_within_half_a_unit(unit, max_words_per_unit):
    ids, special, wids = batch(b=64, t=128, max_word=3)
    rate = 0.15
    out = masker(sampler=uniform(), unit=unit, count="exact")(ids, special, rate, src(len(ids), 9),
                                                                        word_ids=wids)
    n_cand = (~special).sum(1).double()
    budget = torch.floor(rate * n_cand + 0.5)
    got = (out.labels != IGNORE_INDEX).sum(1).double()
    longest_word = torch.tensor([max(len(p) for r_, _, p in word_spans(wids[r : r + 1])) for r in range(len(ids))])
    assert ((got - budget).abs() <= longest_word * max_words_per_unit / 2).all()
    assert abs(float(got.sum() / budget.sum()) - 1) < 0.1  # no systematic over- or under-shoot


def test_span_lengths_are_truncated_geometric():
    # one piece per word: span coverage in words == tokens; long rows so spans rarely touch
    ids, special, _ = batch(b=400, t=256)
    wids = (torch.cumsum((~special).long(), 1) - 1).masked_fill(special, -1)
    out = masker(sampler=uniform(), unit="span", count="exact")(ids, special, 0.05, src(len(ids), 10),
                                                                         word_ids=wids)
    sel = (out.labels != IGNORE_INDEX).int()
    starts = (sel[:, 1:] - sel[:, :-1] == 1).sum()
    mean_run = float(sel.sum() / starts)
    # SpanBERT: Geo(0.2) truncated to [1, 10] has mean 3.8; merged neighbouring spans push the run mean up a little
    assert 3.3 < mean_run < 4.6, mean_run


def test_word_unit_requires_word_ids():
    ids, special, _ = batch(b=2, t=16)
    with pytest.raises(ValueError, match="word_ids"):
        masker(sampler=uniform(), unit="word")(ids, special, 0.15, src(2, 0))


# ---------------------------------------------------------------------------------------------- static masking


def test_splitmix64_matches_reference():
    def ref(z):
        z = (z + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)

    xs = [0, 1, 12345, 2**40 + 7, 2**62]
    got = splitmix64(torch.tensor(xs)).tolist()
    assert [g % 2**64 for g in got] == [ref(x) for x in xs]


def test_static_masks_independent_of_batching():
    ids, special, wids = batch(b=24, t=64)
    block_ids = torch.arange(100, 124)
    m = masker(sampler=uniform(), unit="word")

    def run(rows):
        s = KeyedSource.for_blocks(0, block_ids[rows], 0)
        return m(ids[rows], special[rows], 0.15, s, word_ids=wids[rows])

    whole = run(torch.arange(24))
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    parts = [(perm[i : i + 5], run(perm[i : i + 5])) for i in range(0, 24, 5)]  # other batch size and order
    for rows, out in parts:
        assert torch.equal(out.input_ids, whole.input_ids[rows]) and torch.equal(out.labels, whole.labels[rows])
    other_copy = m(ids, special, 0.15, KeyedSource.for_blocks(0, block_ids, 1), word_ids=wids)
    other_seed = m(ids, special, 0.15, KeyedSource.for_blocks(1, block_ids, 0), word_ids=wids)
    assert not torch.equal(other_copy.labels, whole.labels) and not torch.equal(other_seed.labels, whole.labels)


def test_static_uniforms_are_uniform():
    u = KeyedSource.for_blocks(0, torch.arange(2000), 0).rand(100, 1)
    assert within(int((u < 0.15).sum()), u.numel(), 0.15) and 0 <= float(u.min()) and float(u.max()) < 1
    u64 = KeyedSource.for_blocks(0, torch.arange(10), 0).rand(100, 2, torch.float64)
    assert u64.dtype == torch.float64 and float(u64.max()) < 1


# ------------------------------------------------------------------------------------------ determinism, streams


def test_determinism_and_distinct_streams():
    ids, special, _ = batch()
    m = BertMasker(MASK_ID, 0.8, 0.1, 0.1, sampler=uniform())
    run = lambda *parts: m(ids, special, 0.15, src(len(ids), *parts))  # noqa: E731
    a, b = run(0, 7, 0, 3), run(0, 7, 0, 3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    for other in (run(0, 7, 1, 3), run(0, 7, 0, 4), run(0, 8, 0, 3)):  # another rank, step, seed
        assert not torch.equal(a.labels, other.labels)
    seeds = {mask_seed(0, s, r, k) for s in range(5) for r in range(8) for k in range(200)}
    assert len(seeds) == 5 * 8 * 200


def test_mask_once_is_fixed():
    ids, special, _ = batch(8, 64)
    a = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234)
    b = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


def test_mask_once_by_whole_words():
    """eval.units=[word]: the fixed masks select whole words (every token of a word or none), at about the same token
    rate; the token masks are unchanged by the new arguments (unit=token is the default)."""
    ids, special, _ = batch(16, 64)
    word_ids = torch.arange(64).div(3, rounding_mode="floor").expand(16, 64).contiguous()  # 3-token words
    tok = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234)
    assert torch.equal(tok.labels, mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234,
                                             unit="token", word_ids=word_ids).labels)
    w = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234, unit="word", word_ids=word_ids)
    selected = (w.labels != -100) & ~special.bool()
    for row, wid, sp in zip(selected, word_ids, special.bool()):
        for u in wid[~sp].unique():
            inside = row[(wid == u) & ~sp]
            assert inside.all() or not inside.any()  # whole words only
    assert 0.08 < selected.float().sum() / (~special.bool()).sum() < 0.25
    with pytest.raises(ValueError, match="needs word_ids"):
        mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), uniform(), 1234, unit="word")


def test_bad_masker_arguments_rejected():
    with pytest.raises(ValueError, match="sum to 1"):
        BertMasker(MASK_ID, 0.9, 0.1, 0.1, sampler=uniform())
    with pytest.raises(ValueError, match="mask.count"):
        masker(sampler=uniform(), count="poisson")
    with pytest.raises(ValueError, match="mask.unit"):
        masker(sampler=uniform(), unit="phrase")


# ------------------------------------------------------------------------------------------------ property tests


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 6), t=st.integers(3, 40), rate=st.floats(0.01, 0.95), unit=st.sampled_from(["token", "word", "span"]),
    count=st.sampled_from(["bernoulli", "exact", "prob_round"]), pred=st.one_of(st.none(), st.floats(0.01, 0.95)),
    seed=st.integers(0, 2**31), static=st.booleans(), ratios=st.sampled_from([(0.8, 0.1, 0.1), (1, 0, 0), (0, 1, 0)]),
)
def test_invariants(b, t, rate, unit, count, pred, seed, static, ratios):
    ids, special, wids = batch(b, t, seed=seed % 1000)
    ids = ids.int()
    m = masker(*ratios, sampler=uniform(), unit=unit, count=count, predict_rate=pred)
    source = KeyedSource.for_blocks(seed, torch.arange(b), 0) if static else src(b, seed)
    out = m(ids, special, rate, source, word_ids=wids)
    assert out.input_ids.shape == ids.shape and out.labels.shape == ids.shape and out.kind.shape == ids.shape
    assert out.input_ids.dtype == torch.long and out.labels.dtype == torch.long
    assert out.input_ids.device == ids.device
    predicted = out.labels != IGNORE_INDEX
    assert torch.equal(out.labels[predicted], ids.long()[predicted])  # -100 exactly where not predicted
    assert torch.equal(predicted, (out.kind == PREDICT_ONLY) | ((out.kind != 0) & predicted))
    assert torch.equal(out.input_ids[special], ids.long()[special])  # specials untouched
    assert not ((out.kind != 0) & special).any()
    assert (out.input_ids[out.kind == RANDOM] >= 5).all()
    changed = out.input_ids != ids.long()
    assert not (changed & ((out.kind == 0) | (out.kind == KEPT) | (out.kind == PREDICT_ONLY))).any()


# ---------------------------------------------------------------------------------------------------- schedules


def test_schedule_values_at_chosen_steps():
    total = 1000
    assert Constant(0.2)(500, total) == 0.2
    lin = Linear(0.3, 0.15)
    assert lin(0, total) == pytest.approx(0.3) and lin(500, total) == pytest.approx(0.225)
    assert lin(1000, total) == pytest.approx(0.15) and lin(5000, total) == pytest.approx(0.15)
    cos = Cosine(0.3, 0.15)
    assert cos(0, total) == pytest.approx(0.3) and cos(500, total) == pytest.approx(0.225)
    assert cos(250, total) == pytest.approx(0.15 + 0.15 * 0.5 * (1 + math.cos(math.pi / 4)))
    st_ = Step([0.3, 0.2, 0.15], [0.25, 0.5])
    assert [st_(s, total) for s in (0, 249, 250, 499, 500, 999)] == [0.3, 0.3, 0.2, 0.2, 0.15, 0.15]
    pw = Piecewise([[0, 0.4], [0.5, 0.2], [1, 0.1]])
    assert pw(250, total) == pytest.approx(0.3) and pw(750, total) == pytest.approx(0.15)


def test_bad_schedules_rejected():
    with pytest.raises(ValueError, match="rate"):
        Linear(0.3, 0.0).check()
    with pytest.raises(ValueError, match="sorted"):
        Step([0.3, 0.2, 0.1], [0.6, 0.3])
    with pytest.raises(ValueError, match="len"):
        Step([0.3, 0.2], [0.3, 0.6])
    with pytest.raises(ValueError, match="rate"):
        Piecewise([[0, 0.2], [1, 1.2]]).check()
