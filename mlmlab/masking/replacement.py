"""Samplers for the ids that replace the "random" share of selected positions.

Every sampler is a :class:`DiscreteSampler`: a probability vector over the vocabulary, zero at the special ids, sampled
by exact inverse-CDF lookup of uniforms the caller supplies (the masker's random source), so a draw is a pure function
of its uniform -- reproducible on any device, batch layout or rank. What differs between samplers is only the vector:

- :class:`UniformSampler` (``mask/sampler=uniform``): uniform over the non-special ids (BERT's recipe, minus the
  specials that HF, fairseq and cramming can draw).
- :class:`UnigramSampler` (``mask/sampler=unigram``): ``p(i) ∝ count(i)^alpha`` over the non-special ids seen in the
  training corpus (fairseq's frequency-weighted replacement; ``alpha`` interpolates from "uniform over seen ids" to
  "corpus frequencies").
- :class:`DomainSampler` (``mask/sampler=domain``): ``mix * uniform(D) + (1 - mix) * uniform(non-special)`` for a
  domain vocabulary ``D``, from a word list or from the ids over-represented in a domain corpus.

``exclude_original`` makes every sampler draw from its distribution conditioned on ``id != original``, with the same
single uniform and without a rejection loop, so "random" replacements never silently act as "keep".

This module is pure torch: whatever needs files or a tokenizer (token counts, word lists, domain corpora) comes in
through the callables of a :class:`SamplerContext`, built by :func:`mlmlab.data.vocab_stats.make_sampler_context`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


class SamplerContext:
    """What a sampler may know about the vocabulary and the data; the callables are only called by samplers that need
    them, so a uniform run never counts tokens or reads files.

    A plain class, not a dataclass, on purpose: ``hydra.utils.instantiate(cfg, ctx=ctx)`` would turn a dataclass into
    a DictConfig (its tuples into ListConfigs, its methods gone); a plain object is passed through as is.
    """

    __slots__ = ("vocab_size", "special_ids", "token_counts", "encode_words", "corpus_counts", "read_lines", "unk_id",
                 "doc_freq")

    def __init__(
        self,
        vocab_size: int,
        special_ids: tuple[int, ...],  # never drawn, by construction, by any sampler
        token_counts: Callable[[], torch.Tensor] | None = None,  # int64 [vocab_size] counts of the training corpus
        encode_words: Callable[[list[str]], list[list[int]]] | None = None,  # str -> its piece ids (no [CLS]/[SEP])
        corpus_counts: Callable[[str], torch.Tensor] | None = None,  # path of a domain text corpus -> int64 [vocab_size]
        read_lines: Callable[[str], list[str]] | None = None,  # path of a word-list file -> stripped non-empty lines
        unk_id: int | None = 1,
        doc_freq: Callable[[], tuple[torch.Tensor, int]] | None = None,  # (blocks holding each id, number of blocks)
    ):
        self.vocab_size = int(vocab_size)
        self.special_ids = tuple(int(i) for i in special_ids)
        self.token_counts, self.encode_words, self.corpus_counts = token_counts, encode_words, corpus_counts
        self.read_lines, self.unk_id, self.doc_freq = read_lines, unk_id, doc_freq

    def __repr__(self) -> str:
        given = [k for k in ("token_counts", "encode_words", "corpus_counts", "read_lines") if getattr(self, k)]
        return (f"SamplerContext(vocab_size={self.vocab_size}, special_ids={self.special_ids}, unk_id={self.unk_id}, "
                f"callables={given})")

    def allowed(self) -> torch.Tensor:
        """Bool [vocab_size]: the ids a sampler may draw (all but the specials)."""
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size} must be >= 1")
        ok = torch.ones(self.vocab_size, dtype=torch.bool)
        special = torch.tensor([int(i) for i in self.special_ids if 0 <= int(i) < self.vocab_size], dtype=torch.long)
        ok[special] = False
        if not ok.any():
            raise ValueError(f"no non-special ids to draw from (vocab_size={self.vocab_size}, "
                             f"special_ids={sorted(set(self.special_ids))})")
        return ok

    def need(self, attr: str, sampler: str, what: str):
        fn = getattr(self, attr)
        if fn is None:
            raise ValueError(f"mask.{'' if sampler.startswith('select') else 'sampler='}{sampler} needs {what}, but the SamplerContext has {attr}=None "
                             f"(build it with mlmlab.data.vocab_stats.make_sampler_context)")
        return fn


class DiscreteSampler:
    """Any replacement distribution: a probability vector over the vocabulary (0 at the special ids).

    ``probs`` may be given unnormalised (non-negative weights); it is stored normalised, float64 on the CPU.
    """

    name = "discrete"

    def __init__(self, probs: torch.Tensor, exclude_original: bool = False):
        p = torch.as_tensor(probs).detach().to("cpu", torch.float64).flatten()
        if p.numel() == 0 or not torch.isfinite(p).all() or (p < 0).any() or p.sum() <= 0:
            raise ValueError(f"mask.sampler={self.name}: the replacement weights must be finite, >= 0 and not all 0")
        self.probs = p / p.sum()
        self.exclude_original = bool(exclude_original)
        support = torch.nonzero(self.probs > 0).flatten()
        self.support_size = len(support)
        if self.exclude_original and self.support_size < 2:
            raise ValueError(f"mask.sampler.exclude_original=true cannot exclude the original: mask.sampler={self.name} "
                             f"can only draw the single id {int(support[0])}; allowed: false, or a sampler that can "
                             f"draw >= 2 ids")
        v = len(self.probs)
        self._cdf = self.probs.cumsum(0)  # cdf[i] = P(id <= i); flat over zero-probability ids
        self._lo = torch.cat([self._cdf.new_zeros(1), self._cdf[:-1]])  # start of id i's interval
        self._total = float(self._cdf[-1])
        # repair[i]: i on the support, else the nearest support id above (below at the top end). Applied to every draw:
        # the identity except at float edges, where it keeps the never-a-zero-probability-id guarantee.
        idx = torch.arange(v)
        on = self.probs > 0
        nxt = torch.where(on, idx, v).flip(0).cummin(0).values.flip(0)  # next support id >= i (v if none)
        prv = torch.where(on, idx, -1).cummax(0).values  # previous support id <= i (-1 if none)
        self._repair = torch.where(nxt < v, nxt, prv)
        # alt[i]: a support id != i (next above, else previous below): the fallback should a draw hit the original
        nxt_strict = torch.cat([nxt[1:], nxt.new_full((1,), v)])
        prv_strict = torch.cat([prv.new_full((1,), -1), prv[:-1]])
        self._alt = torch.where(nxt_strict < v, nxt_strict, prv_strict).clamp(min=0)
        self._on: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        t = self._on.get(device)
        if t is None:
            t = self._on[device] = tuple(x.to(device) for x in (self._cdf, self._lo, self._repair, self._alt))
        return t

    def sample(self, u: torch.Tensor, original: torch.Tensor | None = None) -> torch.Tensor:
        """``u``: float uniforms in [0, 1), any shape, any device -> int64 ids of the same shape, on ``u``'s device.

        Inverse CDF: the id whose CDF interval holds ``u``. With ``exclude_original`` and ``original`` given, the draw
        is from the exact conditional distribution given ``id != original``, from the same uniform: ``u`` is rescaled
        to the mass left without the original and shifted past the original's interval. No rejection, no host sync.
        """
        cdf, lo, repair, alt = self._tables(u.device)
        v = len(cdf)
        x = u.to(torch.float64).contiguous()
        if self.exclude_original and original is not None:
            o = original.to(device=u.device, dtype=torch.long)
            in_range = (o >= 0) & (o < v)
            oc = o.clamp(0, v - 1)
            o_lo, o_hi = lo[oc], cdf[oc]
            width = torch.where(in_range, o_hi - o_lo, 0.0)
            x = x * (self._total - width)
            x = torch.where(x >= o_lo, x + width, x)  # skip the original's interval (width 0: x unchanged)
        else:
            x = x * self._total
        x = torch.nan_to_num(x, nan=0.0).clamp_(min=0.0)
        ids = torch.searchsorted(cdf, x, right=True).clamp_(max=v - 1)
        ids = repair[ids]
        if self.exclude_original and original is not None:
            ids = torch.where(ids == o, alt[oc], ids)
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}(support={self.support_size}/{len(self.probs)}, exclude_original={self.exclude_original})"


class UniformSampler(DiscreteSampler):
    """Uniform over the non-special ids."""

    name = "uniform"

    def __init__(self, ctx: SamplerContext, exclude_original: bool = False):
        super().__init__(ctx.allowed().double(), exclude_original)


class UnigramSampler(DiscreteSampler):
    """``p(i) ∝ count(i)^alpha`` over the non-special ids with ``count(i) > 0`` in the training corpus.

    ``alpha=0``: uniform over the ids seen in the corpus; ``alpha=1``: the corpus frequencies; in between: smoothed.
    """

    name = "unigram"

    def __init__(self, ctx: SamplerContext, alpha: float = 1.0, exclude_original: bool = False):
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"mask.sampler.alpha={alpha:g} must be >= 0 (0: uniform over seen ids, 1: corpus frequencies)")
        self.alpha = alpha
        counts = _counts(ctx.need("token_counts", self.name, "the training corpus's token counts")(), ctx,
                         "the training corpus's token counts")
        seen = ctx.allowed() & (counts > 0)
        if not seen.any():
            raise ValueError("mask.sampler=unigram: no non-special id occurs in the training corpus "
                             f"(vocab_size={ctx.vocab_size}); allowed: a corpus with ordinary tokens, or mask/sampler=uniform")
        logw = torch.where(seen, alpha * counts.double().clamp(min=1).log(), -math.inf)
        super().__init__((logw - logw.max()).exp(), exclude_original)  # log space: no overflow for large alpha


class DomainSampler(DiscreteSampler):
    """``mix * uniform(D) + (1 - mix) * uniform(non-special)`` for a domain vocabulary ``D`` (ids), built from either

    - ``word_list``: a file of terms, one per line (``#`` comments); every non-special, non-[UNK] piece of every term
      joins ``D``. ``self.report`` counts the entries, those entirely out of vocabulary (only [UNK]), those split into
      several pieces, and ``|D|``.
    - ``corpus``: a domain text corpus compared with the training corpus by the relative-frequency ratio
      ``r(i) = (c_dom(i) / N_dom) / ((c_gen(i) + 1) / (N_gen + V))`` (add-one smoothed; N and V count the non-special
      ids) over the non-special ids with ``c_dom(i) >= min_count``: ``D = {i: r(i) > threshold}``, or the ``top_k``
      ids by ``r`` when ``top_k`` is set. ``threshold``/``top_k``/``min_count`` are ignored for a word list.
      ``reference``: the general corpus ``c_gen`` counts (a text corpus; null: the training corpus). Continued
      pretraining on the domain corpus itself (``experiment=dapt_finance``) needs it: there the training corpus *is*
      the domain corpus, so nothing would be over-represented relative to it.
    """

    name = "domain"

    def __init__(self, ctx: SamplerContext, word_list: str | None = None, corpus: str | None = None,
                 threshold: float = 4.0, top_k: int | None = None, min_count: int = 5, mix: float = 1.0,
                 exclude_original: bool = False, reference: str | None = None):
        mix = float(mix)
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"mask.sampler.mix={mix:g} must be in [0, 1] (share of draws from the domain vocabulary)")
        if (word_list is None) == (corpus is None):
            raise ValueError("exactly one of mask.sampler.word_list (a file of domain terms) and mask.sampler.corpus "
                             f"(a domain text corpus) must be set; got word_list={word_list!r}, corpus={corpus!r}")
        self.mix = mix
        allowed = ctx.allowed()
        usable = allowed.clone()
        if ctx.unk_id is not None and 0 <= ctx.unk_id < ctx.vocab_size:
            usable[ctx.unk_id] = False
        if word_list is not None:
            ids = self._from_word_list(ctx, str(word_list), usable)
        else:
            if top_k is not None and int(top_k) < 1:
                raise ValueError(f"mask.sampler.top_k={top_k} must be >= 1 or null (null: use mask.sampler.threshold)")
            if not (math.isfinite(float(threshold)) and float(threshold) >= 0):
                raise ValueError(f"mask.sampler.threshold={threshold} must be >= 0 (a ratio of relative frequencies)")
            if int(min_count) < 1:
                raise ValueError(f"mask.sampler.min_count={min_count} must be >= 1")
            ids = self._from_corpus(ctx, str(corpus), usable, float(threshold), top_k, int(min_count), reference)
        self.domain_ids = ids
        in_d = torch.zeros(ctx.vocab_size, dtype=torch.float64)
        in_d[ids] = 1.0
        a = allowed.double()
        super().__init__(mix * in_d / in_d.sum() + (1 - mix) * a / a.sum(), exclude_original)

    def _from_word_list(self, ctx: SamplerContext, path: str, usable: torch.Tensor) -> torch.Tensor:
        read = ctx.need("read_lines", self.name, "a reader for mask.sampler.word_list")
        encode = ctx.need("encode_words", self.name, "the tokenizer (encode_words) for mask.sampler.word_list")
        entries = _call(read, path, "mask.sampler.word_list")
        pieces = encode(list(entries)) if entries else []
        d: set[int] = set()
        n_oov = n_multi = n_partial = 0
        for ids in pieces:
            good = [i for i in ids if 0 <= i < ctx.vocab_size and bool(usable[i])]
            unk = sum(1 for i in ids if i == ctx.unk_id)
            n_multi += bool(good) and len(ids) > 1  # an entry of several [UNK]s counts as out of vocabulary only
            n_oov += not good
            n_partial += bool(good) and unk > 0
            d.update(good)
        self.report = {"entries": len(entries), "oov": n_oov, "multi_piece": n_multi, "partial_oov": n_partial,
                       "domain_ids": len(d)}
        if not d:
            raise ValueError(f"mask.sampler.word_list={path} gave an empty domain vocabulary: {len(entries)} entries, "
                             f"{n_oov} out of vocabulary (a list of terms the tokenizer knows is needed)")
        return torch.tensor(sorted(d), dtype=torch.long)

    def _from_corpus(self, ctx: SamplerContext, path: str, usable: torch.Tensor, threshold: float,
                     top_k: int | None, min_count: int, reference: str | None = None) -> torch.Tensor:
        dom_fn = ctx.need("corpus_counts", self.name, "corpus_counts (to count mask.sampler.corpus)")
        c_dom = _counts(_call(dom_fn, path, "mask.sampler.corpus"), ctx, f"mask.sampler.corpus={path} counts").double()
        if reference is None:
            gen_fn = ctx.need("token_counts", self.name, "the training corpus's token counts (to compare with)")
            c_gen = _counts(gen_fn(), ctx, "the training corpus's token counts").double()
        else:
            c_gen = _counts(_call(lambda p: dom_fn(p, "mask.sampler.reference"), str(reference),
                                  "mask.sampler.reference"), ctx, f"mask.sampler.reference={reference} counts").double()
        allowed = ctx.allowed()
        n_dom, n_gen = c_dom[allowed].sum(), c_gen[allowed].sum()
        if n_dom <= 0:
            raise ValueError(f"mask.sampler.corpus={path} holds no non-special tokens")
        ratio = (c_dom / n_dom) / ((c_gen + 1) / (n_gen + int(allowed.sum())))
        eligible = usable & (c_dom >= min_count)
        ratio = torch.where(eligible, ratio, -math.inf)
        if top_k is not None:
            order = torch.sort(-ratio, stable=True).indices  # ties: the smaller id first
            ids = order[: min(int(top_k), int(eligible.sum()))]
        else:
            ids = torch.nonzero(ratio > threshold).flatten()
        r_max = float(ratio.max()) if eligible.any() else float("nan")
        self.report = {"eligible": int(eligible.sum()), "domain_ids": len(ids), "max_ratio": r_max,
                       "domain_tokens": int(n_dom), "general_tokens": int(n_gen)}
        if len(ids) == 0:
            raise ValueError(f"mask.sampler.corpus={path} gave an empty domain vocabulary: {int(eligible.sum())} ids occur "
                             f">= mask.sampler.min_count={min_count} times, and none has a frequency ratio > "
                             f"mask.sampler.threshold={threshold:g} (largest: {r_max:.3g}); lower the threshold or "
                             f"min_count, or set mask.sampler.top_k")
        return torch.sort(ids).values


def _counts(c, ctx: SamplerContext, what: str) -> torch.Tensor:
    c = torch.as_tensor(c).to("cpu").flatten()
    if len(c) != ctx.vocab_size:
        raise ValueError(f"{what} has {len(c)} entries, expected vocab_size={ctx.vocab_size}")
    if c.is_floating_point() or c.dtype == torch.bool:
        raise ValueError(f"{what} must be integer counts, got dtype {c.dtype}")
    if (c < 0).any():
        raise ValueError(f"{what} must be >= 0")
    return c.long()


def _call(fn, path: str, key: str):
    """Call a context reader, making sure its error names the config key (an error's type is kept if it can be)."""
    try:
        return fn(path)
    except (OSError, ValueError) as e:
        if key in str(e):
            raise
        msg = f"{key}={path}: {e}"
        try:
            err = type(e)(msg) if isinstance(e, ValueError) else ValueError(msg)
        except TypeError:  # an exception type with another constructor (e.g. UnicodeDecodeError)
            err = ValueError(msg)
        raise err from e
