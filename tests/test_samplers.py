"""Replacement samplers (mlmlab.masking.replacement) and their data side (mlmlab.data.vocab_stats).

Statistical tests draw from fixed seeds, so they are deterministic; the threshold says how unlucky a seed would have to
be to fail a correct sampler: a goodness-of-fit test rejects only at p < P_REJECT = 1e-4. Each distribution test is
paired with a wrong hypothesis that the same draws must reject, so the tests can fail.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from mlmlab.config import ConfigError
from mlmlab.data import vocab_stats
from mlmlab.data.builtin import generate_corpus
from mlmlab.data.tokenizer import SPECIAL_TOKENS, UNK, train_wordpiece
from mlmlab.masking.replacement import (
    DiscreteSampler,
    DomainSampler,
    SamplerContext,
    UniformSampler,
    UnigramSampler,
)

ROOT = Path(__file__).resolve().parents[1]
SAMPLER_CONF = ROOT / "conf" / "mask" / "sampler"
P_REJECT = 1e-4
N = 200_000
SPECIAL = tuple(range(len(SPECIAL_TOKENS)))


def _context(cfg, tok, blocks):
    return vocab_stats.make_sampler_context(cfg.data, cfg.tokenizer, cfg.paths, tok, blocks)


def chi2_pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit of counts to a probability vector (0-probability cells must be empty)."""
    obs, p = observed.double(), probs.double() / probs.double().sum()
    cells = p > 0
    assert obs[~cells].sum() == 0, "draws fell on zero-probability ids"
    exp = p[cells] * obs.sum()
    stat = ((obs[cells] - exp) ** 2 / exp).sum()
    dof = torch.tensor(float(cells.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))  # chi2 survival function


def uniforms(n: int = N, seed: int = 0, shape=None) -> torch.Tensor:
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return u if shape is None else u.reshape(shape)


def hist(ids: torch.Tensor, v: int) -> torch.Tensor:
    return torch.bincount(ids.flatten(), minlength=v)


def toy_counts(v: int = 40, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = (1000 / torch.arange(1, v + 1, dtype=torch.float64) ** 1.1 * (0.5 + torch.rand(v, generator=g))).long()
    c[[7, 19, 30]] = 0  # unseen ids
    c[list(SPECIAL)] = 500  # specials are counted in corpora ([UNK]); never drawn anyway
    return c


def word_ctx(v: int, special=SPECIAL, counts=None, unk_id: int | None = 1) -> SamplerContext:
    """A context whose "tokenizer" maps the word "w<i>" to id i and whose word lists are given inline as "a,b,c"."""
    return SamplerContext(
        vocab_size=v, special_ids=tuple(special), unk_id=unk_id,
        token_counts=None if counts is None else (lambda: counts),
        encode_words=lambda words: [[int(t[1:]) if t[1:].isdigit() and int(t[1:]) < v else unk_id
                                     for t in w.split()] for w in words],
        read_lines=lambda spec: [s for s in spec.split(",") if s],
    )


# ------------------------------------------------------------------------------------------- the core guarantees


def edge_uniforms(s: DiscreteSampler) -> torch.Tensor:
    """0, the float just below 1, and the uniforms at and just around every CDF boundary."""
    b = (s._cdf / s._total).clamp(max=1 - 2**-53)
    near = torch.cat([b, torch.nextafter(b, torch.zeros_like(b)), torch.nextafter(b, torch.ones_like(b))])
    return torch.cat([torch.tensor([0.0, 2**-60, 0.5, 1 - 2**-53], dtype=torch.float64), near]).clamp(0, 1 - 2**-53)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v=st.integers(2, 300), data=st.data(), seed=st.integers(0, 2**31 - 1),
       kind=st.sampled_from(["uniform", "unigram", "domain"]), exclude=st.booleans())
def test_never_draws_special_or_zero_probability_ids(v, data, seed, kind, exclude):
    special = data.draw(st.sets(st.integers(0, v - 1), max_size=v - 1))
    allowed = [i for i in range(v) if i not in special]
    g = torch.Generator().manual_seed(seed)
    unk = data.draw(st.sampled_from([None, *special])) if special else None
    if kind == "uniform":
        make = lambda: UniformSampler(SamplerContext(v, tuple(special), unk_id=unk), exclude_original=exclude)  # noqa: E731
    elif kind == "unigram":
        counts = torch.randint(0, 50, (v,), generator=g) * (torch.rand(v, generator=g) < 0.7)
        counts[data.draw(st.sampled_from(allowed))] += 1  # at least one seen ordinary id
        alpha = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
        make = lambda: UnigramSampler(word_ctx(v, special, counts, unk), alpha, exclude_original=exclude)  # noqa: E731
    else:
        dom = data.draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=8))
        mix = data.draw(st.sampled_from([0.0, 0.3, 1.0]))
        spec = ",".join(f"w{i}" for i in dom)
        make = lambda: DomainSampler(word_ctx(v, special, None, unk), word_list=spec, mix=mix, exclude_original=exclude)  # noqa: E731
    try:
        s = make()
    except ValueError as e:  # only legitimate refusals: nothing to exclude from
        assert exclude and "exclude_original" in str(e)
        return
    u = torch.cat([edge_uniforms(s), torch.rand(4000, generator=g, dtype=torch.float64)])
    orig = torch.randint(0, v, u.shape, generator=g)
    ok = s.probs > 0
    assert not ok[list(special)].any()
    for out in (s.sample(u), s.sample(u, orig), s.sample(u.float())):
        assert out.dtype == torch.long and out.shape == u.shape
        assert ok[out].all(), "drew a special or zero-probability id"
    if exclude:
        assert (s.sample(u, orig) != orig).all()


def test_float_edges_and_garbage_uniforms_stay_on_the_support():
    s = UnigramSampler(word_ctx(40, counts=toy_counts()), 1.0, exclude_original=True)
    u = torch.tensor([0.0, 1 - 2**-53, 1.0, 1.5, -0.5, float("nan"), float("inf")], dtype=torch.float64)
    o = torch.tensor([5, 39, 39, 39, 5, 5, 6])
    for out in (s.sample(u), s.sample(u, o)):
        assert (s.probs[out] > 0).all()
    assert (s.sample(u, o) != o).all()


def test_inverse_cdf_uses_half_open_intervals():
    s = DiscreteSampler(torch.tensor([0.0, 1.0, 1.0, 2.0, 0.0]))  # dyadic: the CDF 0, 1/4, 1/2, 1, 1 is exact
    u = torch.tensor([0.0, 0.25 - 2**-54, 0.25, 0.5 - 2**-54, 0.5, 1 - 2**-53], dtype=torch.float64)
    assert s.sample(u).tolist() == [1, 1, 2, 2, 3, 3]  # id i owns [cdf[i-1], cdf[i])
    x = DiscreteSampler(torch.tensor([0.0, 1.0, 1.0, 2.0, 0.0]), exclude_original=True)
    o = torch.full_like(u, 2, dtype=torch.long)  # without id 2: id 1 owns [0, 1/3), id 3 owns [1/3, 1)
    assert x.sample(u, o).tolist() == [1, 1, 1, 3, 3, 3]
    assert x.sample(torch.tensor([1 / 3 - 1e-12, 1 / 3 + 1e-12], dtype=torch.float64), o[:2]).tolist() == [1, 3]


# ------------------------------------------------------------------------------------------- distributions


def test_uniform_goodness_of_fit():
    v = 50
    s = UniformSampler(SamplerContext(v, SPECIAL))
    assert s.name == "uniform" and torch.allclose(s.probs[5:], torch.full((45,), 1 / 45, dtype=torch.float64))
    h = hist(s.sample(uniforms()), v)
    assert h[:5].sum() == 0
    assert chi2_pvalue(h, s.probs) > P_REJECT
    tilted = s.probs.clone()
    tilted[5] *= 1.2  # a 20% excess on one id is caught
    assert chi2_pvalue(h, tilted) < P_REJECT


@pytest.mark.parametrize("alpha,wrong", [(0.0, 0.3), (0.5, 0.3), (0.5, 0.7), (1.0, 0.8)])
def test_unigram_matches_count_power_alpha(alpha, wrong):
    counts = toy_counts()
    s = UnigramSampler(word_ctx(40, counts=counts), alpha=alpha)
    assert s.name == "unigram"

    def expected(a: float) -> torch.Tensor:
        p = counts.double() ** a * (counts > 0)
        p[list(SPECIAL)] = 0
        return p / p.sum()

    assert torch.allclose(s.probs, expected(alpha), rtol=1e-12, atol=0)
    h = hist(s.sample(uniforms(seed=int(alpha * 10))), 40)
    assert h[[7, 19, 30, *SPECIAL]].sum() == 0  # unseen ids and specials never drawn
    assert chi2_pvalue(h, expected(alpha)) > P_REJECT
    assert chi2_pvalue(h, expected(wrong)) < P_REJECT  # the test has the power to reject a wrong exponent


def test_unigram_large_alpha_does_not_overflow():
    counts = torch.zeros(20, dtype=torch.long)
    counts[5:] = torch.arange(1, 16) * 10**9
    s = UnigramSampler(word_ctx(20, counts=counts), alpha=60.0)
    assert torch.isfinite(s.probs).all() and s.probs.argmax() == 19


def test_exclude_original_is_the_exact_conditional():
    counts = toy_counts()
    s = UnigramSampler(word_ctx(40, counts=counts), 1.0, exclude_original=True)
    plain = UnigramSampler(word_ctx(40, counts=counts), 1.0)
    u = uniforms(seed=11)
    for o in (int(s.probs.argmax()), 20, 39):
        orig = torch.full_like(u, o, dtype=torch.long)
        out = s.sample(u, orig)
        assert (out != o).all()
        cond = s.probs.clone()
        cond[o] = 0
        cond /= cond.sum()
        h = hist(out, 40)
        assert chi2_pvalue(h, cond) > P_REJECT
        assert chi2_pvalue(h, s.probs) < P_REJECT  # the unconditional distribution is rejected
        # exact: the same uniform gives the inverse-CDF draw of the conditional distribution
        ref = np.minimum(np.searchsorted(np.cumsum(cond.numpy()), u.numpy() * cond.sum().item(), side="right"), 39)
        assert np.array_equal(out.numpy(), ref)
    # an original outside the support (special, unseen, out of range) leaves the draw unchanged; without
    # exclude_original the original is ignored
    for o in (0, 4, 7, -100, 10_000):
        assert torch.equal(s.sample(u[:1000], torch.full((1000,), o)), s.sample(u[:1000]))
    assert torch.equal(plain.sample(u, torch.full_like(u, 20, dtype=torch.long)), plain.sample(u))


def test_exclude_original_mixed_originals_uniform():
    v = 30
    s = UniformSampler(SamplerContext(v, SPECIAL), exclude_original=True)
    u = uniforms(seed=5)
    orig = torch.randint(0, v, u.shape, generator=torch.Generator().manual_seed(6))
    out = s.sample(u, orig)
    assert (out != orig).all() and (out >= 5).all()
    for o in (5, 17, 29):  # per original: uniform over the other 24 ordinary ids
        sel = out[orig == o]
        cond = s.probs.clone()
        cond[o] = 0
        assert chi2_pvalue(hist(sel, v), cond) > P_REJECT


# ------------------------------------------------------------------------------------------- domain sampler


def test_domain_mix_one_draws_only_domain_ids():
    s = DomainSampler(word_ctx(60), word_list="w10,w11 w12,w40,w3,w70", mix=1.0)  # w3 special, w70 -> [UNK]
    assert s.name == "domain"
    assert s.domain_ids.tolist() == [10, 11, 12, 40]
    assert s.report == {"entries": 5, "oov": 2, "multi_piece": 1, "partial_oov": 0, "domain_ids": 4}
    out = s.sample(uniforms())
    assert set(out.unique().tolist()) == {10, 11, 12, 40}
    assert chi2_pvalue(hist(out, 60), s.probs) > P_REJECT


def test_domain_mix_half_fraction_within_binomial_bounds():
    v, dom = 60, [10, 11, 12, 40]
    s = DomainSampler(word_ctx(v), word_list=",".join(f"w{i}" for i in dom), mix=0.5)
    q = 0.5 + 0.5 * len(dom) / (v - len(SPECIAL))  # domain ids are also part of the uniform share
    k = int(torch.isin(s.sample(uniforms(seed=2)), torch.tensor(dom)).sum())
    assert chi2_pvalue(torch.tensor([k, N - k]), torch.tensor([q, 1 - q])) > P_REJECT  # = binomial test, 1 dof
    for wrong in (0.5 * q, min(1.0, q + 0.01)):
        assert chi2_pvalue(torch.tensor([k, N - k]), torch.tensor([wrong, 1 - wrong])) < P_REJECT
    assert (s.probs[5:] > 0).all()  # mix < 1: every ordinary id can be drawn


@pytest.fixture(scope="module")
def small_tok():
    docs = generate_corpus(300, seed=0)
    return train_wordpiece(docs, 400, True, 2), docs


def test_domain_word_list_with_real_tokenizer(tmp_path, small_tok):
    tok, docs = small_tok
    enc = lambda w: tok.encode(w, add_special_tokens=False).ids  # noqa: E731
    words = sorted(set(" ".join(docs).split()))
    multi = next(w for w in words if len(enc(w)) > 1 and UNK not in enc(w))
    assert enc("the") != [UNK] and len(enc("the")) == 1
    for w in ("жжж", "δέλτα", "日本"):
        assert set(enc(w)) == {UNK}  # entirely out of vocabulary
    assert len(enc("and")) == 1
    lines = ["# finance terms", "  the  ", "", multi, "жжж", "δέλτα", "日本", "the жжж", "#", "and"]
    path = tmp_path / "terms.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    entries = vocab_stats.read_lines(str(path))
    assert entries == ["the", multi, "жжж", "δέλτα", "日本", "the жжж", "and"]
    ctx = SamplerContext(tok.get_vocab_size(), SPECIAL, encode_words=lambda ws: vocab_stats.encode_words(tok, ws),
                         read_lines=lambda p: vocab_stats.read_lines(p), unk_id=UNK)
    s = DomainSampler(ctx, word_list=str(path))
    assert s.report == {"entries": 7, "oov": 3, "multi_piece": 2, "partial_oov": 1,
                        "domain_ids": len({*enc("the"), *enc(multi), *enc("and")})}
    assert s.domain_ids.tolist() == sorted({*enc("the"), *enc(multi), *enc("and")})
    assert set(s.sample(uniforms(10_000)).unique().tolist()) == set(s.domain_ids.tolist())

    oov = tmp_path / "oov.txt"
    oov.write_text("жжж\nδέλτα\n日本\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"mask\.sampler\.word_list=.*oov\.txt gave an empty domain vocabulary: "
                                         r"3 entries, 3 out of vocabulary"):
        DomainSampler(ctx, word_list=str(oov))


# ------------------------------------------------------------------------------------------- device, shape, determinism

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_device_shape_dtype_and_determinism(device):
    counts = toy_counts()
    s = UnigramSampler(word_ctx(40, counts=counts), 0.5, exclude_original=True)
    u = uniforms(2 * 3 * 50, shape=(2, 3, 50)).to(device)
    orig = torch.randint(0, 40, u.shape, generator=torch.Generator().manual_seed(0)).to(device)
    a = s.sample(u, orig)
    assert a.shape == u.shape and a.dtype == torch.long and a.device == u.device
    assert torch.equal(a, s.sample(u, orig))  # same uniforms -> same ids
    twin = UnigramSampler(word_ctx(40, counts=counts), 0.5, exclude_original=True)
    assert torch.equal(a, twin.sample(u, orig))  # ... from any instance
    assert torch.equal(a.cpu(), s.sample(u.cpu(), orig.cpu()))  # ... on any device
    assert torch.equal(s.sample(u[0, 1]), s.sample(u)[0, 1])  # elementwise: independent of the batch layout
    assert torch.equal(s.sample(u.transpose(0, 2), orig.transpose(0, 2)), a.transpose(0, 2))  # non-contiguous
    assert s.sample(torch.empty(0, 7, dtype=torch.float64, device=device)).shape == (0, 7)
    assert s.probs.dtype == torch.float64 and s.probs.sum().item() == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------------------------------- bad input


def _missing(tmp_path):
    return SamplerContext(50, SPECIAL, token_counts=lambda: toy_counts(50),
                          read_lines=lambda p: vocab_stats.read_lines(p, None),
                          encode_words=lambda ws: [[10] for _ in ws],
                          corpus_counts=lambda p: vocab_stats.find_data_path(p, None, "mask.sampler.corpus") and None)


@pytest.mark.parametrize("make,match", [
    (lambda c, t: UnigramSampler(c, alpha=-0.5), r"mask\.sampler\.alpha=-0\.5 must be >= 0"),
    (lambda c, t: UnigramSampler(c, alpha=float("nan")), r"mask\.sampler\.alpha=nan must be >= 0"),
    (lambda c, t: DomainSampler(c, word_list="x", mix=1.5), r"mask\.sampler\.mix=1\.5 must be in \[0, 1\]"),
    (lambda c, t: DomainSampler(c, word_list="x", mix=-0.1), r"mask\.sampler\.mix=-0\.1 must be in \[0, 1\]"),
    (lambda c, t: DomainSampler(c), r"exactly one of mask\.sampler\.word_list .* and mask\.sampler\.corpus"),
    (lambda c, t: DomainSampler(c, word_list="a", corpus="b"), r"exactly one of mask\.sampler\.word_list"),
    (lambda c, t: DomainSampler(c, corpus="b", top_k=0), r"mask\.sampler\.top_k=0 must be >= 1 or null"),
    (lambda c, t: DomainSampler(c, corpus="b", min_count=0), r"mask\.sampler\.min_count=0 must be >= 1"),
    (lambda c, t: DomainSampler(c, corpus="b", threshold=-1), r"mask\.sampler\.threshold=-1 must be >= 0"),
    (lambda c, t: DomainSampler(c, word_list=str(t / "nope.txt")), r"mask\.sampler\.word_list=.*nope\.txt.* does not exist"),
    (lambda c, t: DomainSampler(c, corpus=str(t / "nope_dir")), r"mask\.sampler\.corpus=.*nope_dir.* does not exist"),
])
def test_bad_values_name_the_key(tmp_path, make, match):
    with pytest.raises(ValueError, match=match):
        make(_missing(tmp_path), tmp_path)


def test_missing_files_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"mask\.sampler\.word_list=.*nope\.txt"):
        DomainSampler(_missing(tmp_path), word_list=str(tmp_path / "nope.txt"))


def test_exclude_original_needs_two_ids():
    with pytest.raises(ValueError, match=r"mask\.sampler\.exclude_original=true cannot exclude .* single id 12"):
        DomainSampler(word_ctx(50), word_list="w12", mix=1.0, exclude_original=True)
    counts = torch.zeros(50, dtype=torch.long)
    counts[9] = 4
    with pytest.raises(ValueError, match=r"mask\.sampler\.exclude_original=true .* single id 9"):
        UnigramSampler(word_ctx(50, counts=counts), exclude_original=True)
    with pytest.raises(ValueError, match=r"mask\.sampler\.exclude_original"):
        UniformSampler(SamplerContext(6, SPECIAL), exclude_original=True)
    DomainSampler(word_ctx(50), word_list="w12", mix=0.9, exclude_original=True)  # mix < 1: support is every id


@pytest.mark.parametrize("make,match", [
    (lambda: UnigramSampler(SamplerContext(50, SPECIAL)), r"mask\.sampler=unigram needs .*token_counts=None"),
    (lambda: DomainSampler(SamplerContext(50, SPECIAL), word_list="t.txt"), r"mask\.sampler=domain needs .*read_lines=None"),
    (lambda: DomainSampler(SamplerContext(50, SPECIAL, read_lines=lambda p: ["x"]), word_list="t.txt"),
     r"mask\.sampler=domain needs .*encode_words=None"),
    (lambda: DomainSampler(SamplerContext(50, SPECIAL), corpus="c.txt"), r"mask\.sampler=domain needs .*corpus_counts=None"),
    (lambda: DomainSampler(SamplerContext(50, SPECIAL, corpus_counts=lambda p: toy_counts(50)), corpus="c.txt"),
     r"mask\.sampler=domain needs .*token_counts=None"),
    (lambda: UnigramSampler(SamplerContext(50, SPECIAL, token_counts=lambda: toy_counts(40))), r"40 entries, expected vocab_size=50"),
    (lambda: UnigramSampler(SamplerContext(50, SPECIAL, token_counts=lambda: torch.ones(50))), r"must be integer counts"),
    (lambda: UnigramSampler(SamplerContext(50, SPECIAL, token_counts=lambda: torch.zeros(50, dtype=torch.long))),
     r"no non-special id occurs"),
    (lambda: UniformSampler(SamplerContext(5, SPECIAL)), r"no non-special ids to draw from"),
    (lambda: DiscreteSampler(torch.zeros(5)), r"must be finite, >= 0 and not all 0"),
])
def test_incomplete_context_or_data(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------------------------------- the data side


@pytest.fixture
def run_data(cfg_factory, tmp_path):
    from mlmlab.data.corpus import get_blocks

    cfg = cfg_factory(f"paths.data_dir={tmp_path / 'data'}")
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    return cfg, tok, blocks


def test_make_sampler_context_token_counts(run_data):
    cfg, tok, blocks = run_data
    ctx = _context(cfg, tok, blocks)
    assert ctx.vocab_size == tok.get_vocab_size() and ctx.special_ids == SPECIAL and ctx.unk_id == UNK
    train = blocks["train"]
    counts = ctx.token_counts()
    assert counts.dtype == torch.long and counts.shape == (ctx.vocab_size,)
    assert int(counts.sum()) == int((~train["special_tokens_mask"]).sum())
    assert torch.equal(counts, torch.bincount(train["input_ids"][~train["special_tokens_mask"]].long(),
                                              minlength=ctx.vocab_size))
    assert counts[[0, 2, 3, 4]].sum() == 0  # [PAD]/[CLS]/[SEP]/[MASK] never at non-special positions
    assert list(Path(cfg.paths.cache_dir).glob("token_counts/*/counts.pt"))  # cached on disk
    again = _context(cfg, tok, blocks).token_counts()  # a new run reads the cache
    assert torch.equal(again, counts)
    s = UnigramSampler(ctx, 1.0)
    assert (s.probs[list(SPECIAL)] == 0).all() and torch.equal(s.probs > 0, (counts > 0) & (torch.arange(len(counts)) >= 5))


def test_domain_corpus_route_picks_over_represented_ids(run_data, tmp_path, monkeypatch):
    cfg, tok, blocks = run_data
    ctx = _context(cfg, tok, blocks)
    gen = ctx.token_counts()
    vocab = tok.get_vocab()
    whole = [i for t, i in vocab.items() if i >= 5 and t.isalpha() and gen[i] > 0
             and tok.encode(t, add_special_tokens=False).ids == [i]]
    chosen = sorted(whole, key=lambda i: (int(gen[i]), i))[:3]  # the rarest whole words of the training corpus
    common = max(whole, key=lambda i: (int(gen[i]), -i))  # the most frequent whole word
    words = [tok.id_to_token(i) for i in chosen]
    data = tmp_path / "data"
    data.mkdir()
    lines = [f"{words[k % 3]} {tok.id_to_token(common)} {words[(k + 1) % 3]}" for k in range(60)]
    (data / "domain.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # "domain.txt" is not in the cwd: found under paths.data_dir

    c_dom = ctx.corpus_counts("domain.txt")
    assert int(c_dom.sum()) == 180 and int(c_dom[chosen].sum()) == 120
    top = DomainSampler(ctx, corpus="domain.txt", top_k=3)
    assert top.domain_ids.tolist() == sorted(chosen)  # domain ids come in id order

    s = DomainSampler(ctx, corpus="domain.txt", threshold=4.0, min_count=5)
    # reference: the relative-frequency ratio, written out independently
    allowed = np.ones(ctx.vocab_size, bool)
    allowed[list(SPECIAL)] = False
    cd, cg = c_dom.numpy().astype(float), gen.numpy().astype(float)
    r = (cd / cd[allowed].sum()) / ((cg + 1) / (cg[allowed].sum() + allowed.sum()))
    ref = np.nonzero(allowed & (cd >= 5) & (r > 4.0))[0].tolist()
    assert s.domain_ids.tolist() == ref and set(chosen) <= set(ref)
    assert s.report["domain_ids"] == len(ref) and s.report["eligible"] == 4
    assert set(s.sample(uniforms(5000)).unique().tolist()) <= set(ref)

    assert list(Path(cfg.paths.cache_dir).glob("corpus_counts/*/counts.pt"))
    assert torch.equal(_context(cfg, tok, blocks).corpus_counts("domain.txt"), c_dom)
    with pytest.raises(ValueError, match=r"mask\.sampler\.corpus=domain\.txt gave an empty domain vocabulary: 4 ids "
                                         r"occur >= mask\.sampler\.min_count=5 times.*threshold=1e\+06"):
        DomainSampler(ctx, corpus="domain.txt", threshold=1e6)
    with pytest.raises(ConfigError, match=r"mask\.sampler\.corpus='absent\.txt' does not exist; looked for .*absent\.txt "
                                          r"and .*data/absent\.txt"):
        DomainSampler(ctx, corpus="absent.txt")
    with pytest.raises(ConfigError, match=r"mask\.sampler\.word_list='absent\.txt' does not exist"):
        DomainSampler(ctx, word_list="absent.txt")


def test_read_lines_rejects_non_utf8_and_folders(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"mask\.sampler\.word_list=.*latin1\.txt.* is not valid UTF-8"):
        vocab_stats.read_lines(str(bad))
    with pytest.raises(ConfigError, match=r"is not a file"):
        vocab_stats.read_lines(str(tmp_path))


def test_sampler_yamls_instantiate(run_data, tmp_path):
    cfg, tok, blocks = run_data
    ctx = _context(cfg, tok, blocks)
    terms = tmp_path / "terms.txt"
    terms.write_text("the\nand\n", encoding="utf-8")
    paths = sorted(p for p in SAMPLER_CONF.glob("*.yaml") if "defaults" not in OmegaConf.load(p))  # presets: below
    assert [p.stem for p in paths] == ["domain", "uniform", "unigram"]
    for p in paths:
        node = OmegaConf.load(p)
        assert node._target_ == f"mlmlab.masking.replacement.{p.stem.capitalize()}Sampler"
        if p.stem == "domain":
            with pytest.raises(InstantiationException) as err:  # the defaults name no domain vocabulary
                instantiate(node, ctx=ctx)
            assert isinstance(err.value.__cause__, ValueError)  # Hydra wraps the sampler's own error
            assert "exactly one of mask.sampler.word_list" in str(err.value.__cause__)
            node = OmegaConf.merge(node, {"word_list": str(terms)})
        s = instantiate(node, ctx=ctx)
        assert s.name == p.stem and not s.exclude_original
        assert (s.probs[list(SPECIAL)] == 0).all() and math.isclose(float(s.probs.sum()), 1.0)
        every_key_commented = all("#" in line for line in p.read_text().splitlines() if line and not line.startswith(("#", "_target_")))
        assert every_key_commented, f"{p.name}: every key needs a one-line comment"
    assert instantiate(OmegaConf.merge(OmegaConf.load(SAMPLER_CONF / "unigram.yaml"), {"alpha": 0.0}), ctx=ctx).alpha == 0.0


@pytest.mark.parametrize("name", ["uniform", "unigram", "domain"])
def test_composed_config_sampler_group_instantiates(cfg_factory, tmp_path, name):
    """``mask/sampler=<name>`` composes with the real config, and ``mask.sampler`` instantiates with a run's context."""
    from mlmlab.data.corpus import get_blocks

    terms = tmp_path / "terms.txt"
    terms.write_text("the\nand\n", encoding="utf-8")
    extra = [f"mask.sampler.word_list={terms}", "mask.sampler.mix=0.5"] if name == "domain" else []
    cfg = cfg_factory(f"mask/sampler={name}", *extra)
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    s = instantiate(cfg.mask.sampler, ctx=_context(cfg, tok, blocks))
    assert s.name == name and (s.probs[list(SPECIAL)] == 0).all()


@pytest.mark.parametrize("preset, corpus", [("domain_finance", "finance_corpus/train.txt"),
                                            ("domain_medical", "medical/corpus/train.txt")])
def test_domain_corpus_presets(preset, corpus, cfg_factory, tmp_path):
    """``mask/sampler=domain_finance`` / ``domain_medical``: the domain sampler with its vocabulary derived from
    ../shared/data's finance news / NCBI disease abstracts."""
    from conftest import SHARED

    from mlmlab.data.corpus import get_blocks

    if not (SHARED / corpus).exists():
        pytest.skip(f"no {corpus} under {SHARED}")
    cfg = cfg_factory(f"mask/sampler={preset}", f"paths.data_dir={SHARED}")
    assert cfg.mask.sampler.corpus == str(SHARED / corpus)
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    s = instantiate(cfg.mask.sampler, _partial_=True)(ctx=_context(cfg, tok, blocks))
    assert s.name == "domain" and 0 < int((s.probs > 0).sum()) < tok.get_vocab_size()
