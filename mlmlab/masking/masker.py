"""Select units (count rule), split corruption from prediction, apply [MASK]/random/keep, build labels.

Everything is vectorized torch on the batch's device: no Python loop over sequences, no host-device sync.

Randomness comes only from a :class:`RandomSource`:

- :class:`GeneratorSource` (dynamic masking, the default): a ``torch.Generator`` seeded from (seed, rank, step,
  micro-batch) by :func:`make_generator`, so the mask stream is reproducible, differs across DDP ranks, and needs no
  state in a checkpoint: resuming at step k regenerates exactly the masks step k would have had.
- :class:`KeyedSource` (static masking): uniforms are a counter-based hash of (seed, block id, copy, position, draw),
  so the mask of a block does not depend on the batch it lands in, the batch size, the worker count or the rank layout.

The masking axes (``mask.*``):

- unit: ``token``; ``word`` (whole-word masking from the blocks' ``word_ids``); ``span`` (SpanBERT: spans of whole words
  with geometric lengths, anchored at word starts). The [MASK]/random/keep decision is taken per unit.
- count: ``bernoulli`` (every unit independently with probability ``rate``, HF's behaviour); ``exact``
  (round(rate x candidates) tokens per sequence: static shapes for token units); ``prob_round`` (fairseq: floor plus a
  Bernoulli on the fraction). Budget rules take units in random order and stop at the prefix whose token count is
  closest to the budget, so whole words are never split and the realized rate is unbiased up to half a unit.
- predict_rate (Wettig et al.'s m_pred vs m_corr): units are selected at max(rate, predict_rate); if prediction is the
  larger, a rate/predict_rate share of the predicted units is corrupted and the rest are predicted from an uncorrupted
  input; if corruption is the larger, only a predict_rate/rate share of the corrupted units is predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mlmlab.masking.config import COUNT_RULES, UNITS, MaskConfig, ReplaceConfig  # noqa: F401  (the group's owner)
from mlmlab.masking.selection import selection_probs, unit_weights
from mlmlab.models.encoder import IGNORE_INDEX  # the loss's ignore label, defined once

NOT_SELECTED, MASKED, RANDOM, KEPT, PREDICT_ONLY = 0, 1, 2, 3, 4

# draw tags: every random decision of the masker reads its own stream
_T_SELECT, _T_ROUND, _T_BINOM, _T_SPLIT, _T_REPLACE, _T_RANDOM_ID, _T_SPAN_LEN = range(1, 8)


def mask_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integer parts, e.g. (seed, rank, step, micro); no collisions between tuples."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def make_generator(device: torch.device | str, *parts: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(mask_seed(*parts))
    return g


# ------------------------------------------------------------------------------------------------- random sources


class GeneratorSource:
    """Uniforms from one ``torch.Generator``, drawn in call order (dynamic masking)."""

    def __init__(self, generator: torch.Generator, batch_size: int, device: torch.device):
        self.g, self.b, self.device = generator, batch_size, device

    def rand(self, n: int, tag: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.rand((self.b, n), generator=self.g, device=self.device, dtype=dtype)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_M1, _M2, _GOLD = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(0x9E3779B97F4A7C15)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 tensors (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (two's-complement wrap-around arithmetic)."""
    z = z + _GOLD
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


class KeyedSource:
    """Uniforms that are a pure function of (row key, column, draw tag): static masks keyed by block, not by batch."""

    def __init__(self, row_keys: torch.Tensor):
        self.keys = splitmix64(row_keys.long().reshape(-1, 1))

    @classmethod
    def for_blocks(cls, seed: int, block_ids: torch.Tensor, copy: torch.Tensor | int) -> KeyedSource:
        copy = torch.as_tensor(copy, device=block_ids.device).long()
        k = splitmix64(splitmix64(torch.full_like(block_ids.long(), mask_seed(seed, 0x57A71C))) ^ block_ids.long())
        return cls(k ^ splitmix64(copy.expand_as(k) + 0x5EED))

    def rand(self, n: int, tag: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        cols = torch.arange(n, device=self.keys.device, dtype=torch.long)[None] + (tag << 40)
        h = splitmix64(self.keys ^ splitmix64(cols))
        if dtype == torch.float64:
            return _shr(h, 11).double() * 2.0**-53
        return (_shr(h, 40).float() * 2.0**-24).to(dtype)


# ---------------------------------------------------------------------------------------------------------- masker


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # corrupted ids (long)
    labels: torch.Tensor  # original id where predicted, IGNORE_INDEX elsewhere
    kind: torch.Tensor  # int8 per position: NOT_SELECTED / MASKED / RANDOM / KEPT / PREDICT_ONLY
    n_units: torch.Tensor | None = None  # predicted units per sequence


def _truncated_geometric_cdf(p: float, lo: int, hi: int) -> torch.Tensor:
    lengths = torch.arange(lo, hi + 1, dtype=torch.float64)
    w = p * (1 - p) ** (lengths - 1)
    return (w / w.sum()).cumsum(0)


class Masker:
    """The masking function of one run. Call with a batch, the current rate and a random source."""

    def __init__(self, mask_token_id: int, cfg: MaskConfig | None = None, sampler=None, weights=None):
        """``cfg``: the ``mask.*`` group (:class:`MaskConfig`, whose rules ran when it was built; None: its defaults);
        ``sampler``: the random-replacement sampler built from ``mask.sampler``; ``weights``: the selection weights of
        ``mask.select`` (mlmlab.masking.selection; None: uniform selection)."""
        cfg = MaskConfig() if cfg is None else cfg
        if cfg.replace.random > 0 and sampler is None:
            raise ValueError("a sampler is required when mask.replace.random > 0")
        self.cfg = cfg
        self.mask_token_id = mask_token_id
        self.p_mask, self.p_random = float(cfg.replace.mask), float(cfg.replace.random)
        self.sampler, self.count, self.unit, self.weights = sampler, cfg.count, cfg.unit, weights
        self.min_per_seq = cfg.min_units
        self.predict_rate = cfg.predict_rate
        self.span_min, self.span_max = cfg.span.min_len, cfg.span.max_len
        self._span_cdf = _truncated_geometric_cdf(cfg.span.p, cfg.span.min_len, cfg.span.max_len)

    @classmethod
    def from_config(cls, cfg: MaskConfig, mask_token_id: int, sampler=None, weights=None) -> Masker:
        return cls(mask_token_id, cfg, sampler, weights)

    # ------------------------------------------------------------------ units
    def _units(self, special: torch.Tensor, word_ids: torch.Tensor | None):
        """Per-position unit id (-1 for non-candidates) and per-unit token count, both (B, L)."""
        cand = ~special
        b, n = special.shape
        if self.unit == "token":
            uid = torch.arange(n, device=special.device).expand(b, n).masked_fill(special, -1)
            return uid, cand.long()
        if word_ids is None:
            raise ValueError(f"mask.unit={self.unit} needs word_ids in the batch (the packed blocks carry them)")
        uid = word_ids.long().masked_fill(special, -1)
        ulen = torch.zeros((b, n + 1), dtype=torch.long, device=special.device)
        ulen.scatter_add_(1, uid.clamp(min=-1) + 1, cand.long())  # slot 0 collects non-candidates
        return uid, ulen[:, 1:]

    # ------------------------------------------------------------------ budgets
    def _budget(self, n_cand: torch.Tensor, rate: float, src, n: int) -> torch.Tensor:
        x = rate * n_cand.double()
        if self.count == "exact":
            return torch.floor(x + 0.5).long()
        if self.count == "prob_round":
            frac = x - torch.floor(x)
            return (torch.floor(x) + (src.rand(1, _T_ROUND, torch.float64)[:, 0] < frac)).long()
        # bernoulli with span units: a Binomial(n_cand, rate) budget, the token count independent selection would give
        return ((src.rand(n, _T_BINOM) < rate) & (torch.arange(n, device=n_cand.device)[None] < n_cand[:, None])).sum(1)

    @staticmethod
    def _closest_prefix(cum: torch.Tensor, budget: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Number k of leading entries whose cumulated token count ``cum[:, k-1]`` is closest to ``budget``."""
        zero = torch.zeros_like(cum[:, :1])
        diff = (torch.cat([zero, cum], 1) - budget[:, None]).abs().double()
        ok = torch.cat([torch.ones_like(valid[:, :1]), valid], 1)
        return diff.masked_fill(~ok, float("inf")).argmin(1)  # first minimum: ties go to the smaller prefix

    def _bernoulli_tokens(self, cand: torch.Tensor, rate: float, src) -> torch.Tensor:
        """Token units, Bernoulli count: every candidate independently with probability ``rate`` (plus the
        ``min_per_seq`` lowest-scored candidates); the same draws and result as the general unit path."""
        score = src.rand(cand.shape[1], _T_SELECT)
        sel = (score < rate) & cand
        if self.min_per_seq > 0:
            score = score.masked_fill(~cand, 2.0)
            k_min = torch.clamp(cand.sum(1), max=self.min_per_seq)
            sel |= (score.argsort(1).argsort(1) < k_min[:, None]) & cand
        return sel

    def _select_units(self, uid, ulen, rate: float, src, w: torch.Tensor | None = None) -> torch.Tensor:
        """Boolean (B, L) over unit slots: which units are selected; ``w``: the units' selection weights (None:
        uniform; mlmlab.masking.selection)."""
        b, n = ulen.shape
        exists = ulen > 0
        n_units = exists.sum(1)
        score = src.rand(n, _T_SELECT).masked_fill(~exists, 2.0)
        if w is not None:  # weighted order without replacement (Efraimidis-Spirakis keys); zero weight: last
            key = torch.where(exists & (w > 0), -torch.log(score.double().clamp(min=1e-12)) / w.clamp(min=1e-300),
                              torch.full_like(w, float("inf")))
            key = torch.where(exists, key, torch.full_like(key, float("inf")))
        if self.count == "bernoulli" and self.unit != "span":
            sel = score < (rate if w is None else selection_probs(w, exists, rate).to(score.dtype))
            k_min = torch.clamp(n_units, max=self.min_per_seq)
            if self.min_per_seq > 0:
                rank = (score if w is None else key).argsort(1).argsort(1)
                sel |= rank < k_min[:, None]
            return sel & exists
        n_cand = ulen.sum(1)
        budget = self._budget(n_cand, rate, src, n)
        if self.unit == "span":
            return self._select_spans(ulen, exists, n_units, score, budget, src)
        order = score.argsort(1) if w is None else key.argsort(dim=1, stable=True)
        cum = ulen.gather(1, order).cumsum(1)
        valid = exists.gather(1, order)
        k = self._closest_prefix(cum, budget, valid)
        k = torch.maximum(k, torch.clamp(n_units, max=self.min_per_seq))
        rank_sel = torch.arange(n, device=ulen.device)[None] < k[:, None]
        return torch.zeros_like(exists).scatter(1, order, rank_sel) & exists

    def _select_spans(self, ulen, exists, n_units, score, budget, src) -> torch.Tensor:
        """SpanBERT: spans of whole words; anchors are distinct random word starts, lengths truncated-geometric;
        spans are added in order until the covered token count is closest to the budget."""
        b, n = ulen.shape
        k_max = int(min(n, max(1, self.min_per_seq) + 8 + n // 2))  # enough candidate spans to reach any budget
        anchors = score.argsort(1)[:, :k_max]  # (B, K) word indices in random order (existing words first)
        anchor_ok = exists.gather(1, anchors)
        cdf = self._span_cdf.to(ulen.device)
        lengths = torch.searchsorted(cdf, src.rand(k_max, _T_SPAN_LEN, torch.float64), right=True)
        lengths = lengths.clamp(max=len(cdf) - 1) + self.span_min  # (B, K)
        w = torch.arange(n, device=ulen.device)
        cover = (w[None, None] >= anchors[..., None]) & (w[None, None] < (anchors + lengths)[..., None])
        cover &= exists[:, None, :] & anchor_ok[..., None]
        union = cover.cummax(1).values  # (B, K, W): words covered by the first k spans
        cum = (union.long() * ulen[:, None, :]).sum(-1)  # (B, K)
        k = self._closest_prefix(cum, budget, anchor_ok)
        k = torch.maximum(k, torch.clamp(n_units, max=self.min_per_seq).clamp(max=k_max))
        take = (k - 1).clamp(min=0)
        sel = union.gather(1, take[:, None, None].expand(b, 1, n))[:, 0]
        return sel & (k > 0)[:, None]

    # ------------------------------------------------------------------ call
    def __call__(self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, rate: float, source,
                 word_ids: torch.Tensor | None = None) -> MaskedBatch:
        ids = input_ids.long()
        special = special_tokens_mask.bool()
        b, n = ids.shape
        pred_rate = rate if self.predict_rate is None else self.predict_rate
        sel_rate = max(rate, pred_rate)
        # BERT's selection: no unit bookkeeping needed
        fast = self.unit == "token" and self.count == "bernoulli" and self.weights is None
        if fast:
            cand = ~special
            sel_u = self._bernoulli_tokens(cand, sel_rate, source)
        else:
            uid, ulen = self._units(special, word_ids)
            w = None if self.weights is None else unit_weights(self.weights.token_weights(ids), uid, ulen)
            sel_u = self._select_units(uid, ulen, sel_rate, source, w)

        corrupt_u, predict_u = sel_u, sel_u
        if pred_rate != rate:
            v = source.rand(n, _T_SPLIT)
            if pred_rate > rate:
                corrupt_u = sel_u & (v < rate / pred_rate)
            else:
                predict_u = sel_u & (v < pred_rate / rate)
        r = source.rand(n, _T_REPLACE)
        mask_u = corrupt_u & (r < self.p_mask)
        random_u = corrupt_u & (r >= self.p_mask) & (r < self.p_mask + self.p_random)

        if fast:
            to_tok = lambda u: u  # noqa: E731  (unit slot == position, and selected units are candidates already)
        elif self.unit == "token":
            cand = uid >= 0
            to_tok = lambda u: u & cand  # noqa: E731  (unit slot == position)
        else:
            cand, g = uid >= 0, uid.clamp(min=0)
            to_tok = lambda u: u.gather(1, g) & cand  # noqa: E731
        corrupt, predict = to_tok(corrupt_u), to_tok(predict_u)
        to_mask, to_random = to_tok(mask_u), to_tok(random_u)

        out_ids = ids.masked_fill(to_mask, self.mask_token_id)
        if self.p_random > 0:
            u = source.rand(n, _T_RANDOM_ID, torch.float64)  # one uniform per position: the stream never depends on
            if ids.device.type != "cpu":  # where the random positions fell
                # drawn for every position and used where needed: no host sync on an accelerator
                out_ids = torch.where(to_random, self.sampler.sample(u, ids), out_ids)
            else:  # on the CPU, look up only the ~1.5% of positions that need an id (same ids, a fraction of the work)
                pos = to_random.view(-1).nonzero().squeeze(1)
                out_ids.view(-1)[pos] = self.sampler.sample(u.view(-1)[pos], ids.reshape(-1)[pos])
        kind = torch.zeros((b, n), dtype=torch.int8, device=ids.device)
        if predict is not corrupt:  # later fills win: random/[MASK] on top of kept, kept on top of predict-only
            kind.masked_fill_(predict, PREDICT_ONLY)
        kind.masked_fill_(corrupt, KEPT)
        kind.masked_fill_(to_mask, MASKED).masked_fill_(to_random, RANDOM)
        labels = ids.masked_fill(~predict, IGNORE_INDEX)
        return MaskedBatch(out_ids, labels, kind, n_units=predict_u.sum(1))


def BertMasker(mask_token_id: int, mask: float, random: float, keep: float, sampler,  # noqa: N802
               unit: str = "token") -> Masker:
    """BERT's recipe: units (tokens, or whole words) selected independently with probability ``rate``, then the
    given [MASK]/random/keep split (the fixed eval masks)."""
    return Masker(mask_token_id, MaskConfig(unit=unit, replace=ReplaceConfig(mask, random, keep)), sampler)


@dataclass(frozen=True)
class MaskingRecipe:
    """Everything a pretraining module masks with, built once from ``mask.*`` by :meth:`from_config`: the masking
    function, the rate schedule ``(step, max_steps) -> rate``, where each batch's random numbers come from (dynamic:
    a generator per step; static: keyed by block and copy), and the vocabulary's special ids (never selected, never a
    replacement, never sampled by an ELECTRA generator)."""

    masker: Masker
    schedule: Callable[[int, int], float]
    special_ids: tuple[int, ...]
    dynamic: bool = True
    static_copies: int = 1

    @classmethod
    def from_config(cls, mask: MaskConfig, mask_token_id: int, special_ids: Sequence[int], sampler,
                    schedule: Callable[[int, int], float], weights=None) -> MaskingRecipe:
        """``mask.*`` (a :class:`MaskConfig`) -> the recipe; ``sampler``, ``schedule`` and ``weights`` are the objects
        built from ``mask.sampler`` / ``mask.schedule`` / ``mask.select`` (None: uniform selection)."""
        return cls(Masker.from_config(mask, mask_token_id, sampler, weights), schedule,
                   tuple(int(i) for i in special_ids), mask.dynamic, mask.static_copies)


def telemetry(original: torch.Tensor, special_tokens_mask: torch.Tensor, out: MaskedBatch) -> dict[str, torch.Tensor]:
    """Realized corruption of one batch: what was actually done, to compare with what was asked for."""
    special = special_tokens_mask.bool()
    predicted = out.labels != IGNORE_INDEX
    corrupted = (out.kind == MASKED) | (out.kind == RANDOM) | (out.kind == KEPT)
    n_corr = corrupted.sum().clamp(min=1).float()
    n_eligible = (~special).sum().clamp(min=1).float()
    random_pos = out.kind == RANDOM
    has_cand = (~special).any(1)
    stats = {
        "selected_frac": predicted.sum() / n_eligible,
        "corrupted_frac": corrupted.sum() / n_eligible,
        "mask_frac": (out.kind == MASKED).sum() / n_corr,
        "random_frac": random_pos.sum() / n_corr,
        "keep_frac": (out.kind == KEPT).sum() / n_corr,
        "random_equals_original": (random_pos & (out.input_ids == original.long())).sum()
        / random_pos.sum().clamp(min=1).float(),
        "special_selected": ((predicted | corrupted) & special).sum().float(),
        "zero_target_seqs": ((predicted.sum(1) == 0) & has_cand).float().mean(),
    }
    if out.n_units is not None:
        stats["units_per_seq"] = out.n_units.float().mean()
    return stats


def mask_once(input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, rate: float, mask_token_id: int,
              replace: tuple[float, float, float], sampler, seed: int, unit: str = "token",
              word_ids: torch.Tensor | None = None) -> MaskedBatch:
    """Mask a whole tensor once with its own seed: the fixed evaluation masks, identical for every run that shares
    the validation data and these arguments -- whatever the training masking (Bernoulli per ``unit``: tokens, or whole
    words from ``word_ids``; uniform replacements)."""
    src = GeneratorSource(make_generator(input_ids.device, seed), input_ids.shape[0], input_ids.device)
    return BertMasker(mask_token_id, *replace, sampler=sampler, unit=unit)(input_ids, special_tokens_mask, rate, src,
                                                                           word_ids=word_ids)
