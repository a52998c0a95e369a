"""Masking statistics and contracts: realized rates within binomial bounds, specials never touched, determinism."""

import math

import pytest
import torch

from mlmlab.masking import BertMasker, UniformSampler, make_generator, mask_once, mask_seed, telemetry
from mlmlab.masking.masker import IGNORE_INDEX, KEPT, MASKED, RANDOM

V, MASK_ID = 1000, 4


def batch(b=64, t=128):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    ids[::3, t - 28 :] = 0  # padded tails
    ids[::3, t - 29] = 3
    return ids, ids < 5


def within(count, n, p, sigmas=5.0):
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("rate", [0.05, 0.15, 0.4])
@pytest.mark.parametrize("ratios", [(0.8, 0.1, 0.1), (0.5, 0.3, 0.2), (1.0, 0.0, 0.0)])
def test_rates_and_split_within_binomial_bounds(rate, ratios):
    ids, special = batch()
    m = BertMasker(MASK_ID, *ratios, sampler=UniformSampler(V, range(5)))
    out = m(ids, special, rate, make_generator("cpu", 0, 0, 0, 0))
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


def test_sampler_uniform_over_non_special_ids():
    s = UniformSampler(50, range(5))
    draws = s.sample((200_000,), torch.Generator().manual_seed(1), torch.device("cpu"))
    assert draws.min() >= 5 and draws.max() < 50
    counts = torch.bincount(draws, minlength=50)[5:].double()
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < 45 + 6 * math.sqrt(2 * 44)  # chi-square with 44 dof, far tail


def test_determinism_and_distinct_streams():
    ids, special = batch()
    m = BertMasker(MASK_ID, 0.8, 0.1, 0.1, sampler=UniformSampler(V, range(5)))
    run = lambda *parts: m(ids, special, 0.15, make_generator("cpu", *parts))  # noqa: E731
    a, b = run(0, 7, 0, 3), run(0, 7, 0, 3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    for other in (run(0, 7, 1, 3), run(0, 7, 0, 4), run(0, 8, 0, 3)):  # another rank, step, seed
        assert not torch.equal(a.labels, other.labels)
    seeds = {mask_seed(0, s, r, k) for s in range(5) for r in range(8) for k in range(200)}
    assert len(seeds) == 5 * 8 * 200


def test_mask_once_is_fixed():
    ids, special = batch(8, 64)
    s = UniformSampler(V, range(5))
    a = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), s, 1234)
    b = mask_once(ids, special, 0.15, MASK_ID, (0.8, 0.1, 0.1), s, 1234)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


def test_bad_ratios_rejected():
    with pytest.raises(ValueError, match="sum to 1"):
        BertMasker(MASK_ID, 0.9, 0.1, 0.1, sampler=UniformSampler(V, range(5)))
