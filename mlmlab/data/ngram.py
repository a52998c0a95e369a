"""The unigram and bigram reference losses of a job's fixed evaluation masks: what ``val/mlm_loss_r15`` would read for
a model that knows only the training corpus's token frequencies (``val/unigram_loss_r15``) or, in addition, which
token follows which (``val/bigram_loss_r15``). :mod:`mlmlab.phase` names an encoder's phase from them.

Both are scored like the MLM loss itself: the mean cross-entropy (nats) over the masked positions of the fixed
evaluation masks (``eval.*``), and both see what the model sees:

- **unigram**: ``p(x) = (c(x) + k) / (N + k |S|)``, the training blocks' counts at their non-special positions (the
  targets' support ``S``: the non-special ids and ``[UNK]``), add-k with :data:`UNIGRAM_K` = 1 (Laplace: the
  convention of ``data.unigram_loss_eval`` and the BLiMP unigram floor; at corpus sizes the mass it moves is
  ``|S| / N``, 0.1% for IMDB's 8M tokens and 8,192 ids);
- **bigram**: ``p(x | h)``, ``h`` the left neighbour *as the masks show it* (a random replacement there is the context
  the model gets too; ``[CLS]``/``[SEP]`` are contexts; a left neighbour shown as ``[MASK]``, or none, leaves the
  unigram), interpolated Witten-Bell: ``p(x | h) = (c(h, x) + T(h) p(x)) / (c(h) + T(h))``, ``T(h)`` the number of
  distinct tokens seen after ``h``. Witten-Bell, not Jelinek-Mercer: it has no weight to fit, so it needs no held-out
  text and is fitted on the training blocks alone, and it trusts a context in proportion to how often it was seen
  against how many continuations it has -- the right behaviour for frequent function-word contexts and rare
  subword contexts alike;
- **the shown token**: at a position the masks show as a token ``s`` (``eval.replace.random``: a draw of the eval
  sampler ``u``; ``eval.replace.keep``: the original) instead of ``[MASK]``, the reference is the posterior under
  the eval masks' own corruption, ``p(x | h, s) ∝ p(x | h) (keep [x = s] + random u(s))`` -- what the model can learn
  from the shown token. Without it a model that learned the unigram and to copy the shown token (a fifth of the
  positions at 80/10/10) would read as below the unigram, i.e. past a regime it never left. The references
  that ignore the shown token are recorded too (results.json ``data.ngram_reference``: ``*_blind``), with the
  references at the ``[MASK]`` positions alone (compare ``val/mlm_loss_at_mask_r15``).

Counting is sparse (the sorted distinct ``(h, x)`` pairs and their counts from ``torch.unique``, merged over row
chunks; never a dense ``V x V`` table: 8,192^2 would be 512 MB of int64) and vectorised; written here in torch rather
than with an n-gram library (nltk, kenlm) because those are heavy for ~100 lines of counting, score strings rather
than the masks' id tensors, and neither conditions on a shown token. The numbers are cached once per corpus,
tokenizer, block shape and evaluation masks (``<cache_dir>/ngram_reference/<hash>/``, :func:`cached_reference`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from mlmlab.data.cache import cached_file
from mlmlab.data.corpus import iter_rows

log = logging.getLogger(__name__)

UNIGRAM_K = 1.0  # add-k of the unigram (Laplace), see the module docstring
VERSION = 1  # of the reference losses' definition: part of the cache key


@dataclass(frozen=True)
class NgramCounts:
    """The training blocks' statistics: the smoothed unigram ``p`` (float64 [V], 0 off the targets' support), the
    sorted distinct pair keys ``h * V + x`` with their counts, and per context ``h`` its pair total and distinct
    continuations."""

    p: torch.Tensor
    keys: torch.Tensor
    pair_counts: torch.Tensor
    context_total: torch.Tensor
    context_types: torch.Tensor
    tokens: int

    @property
    def vocab_size(self) -> int:
        return len(self.p)

    def bigram(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Witten-Bell ``p(x | h)`` (float64); ``h < 0`` or a context never seen: the unigram ``p(x)``."""
        v = self.vocab_size
        hh = h.clamp(min=0)
        p = self.p[x]
        if len(self.keys) == 0:
            return p
        k = hh * v + x
        at = torch.searchsorted(self.keys, k).clamp(max=len(self.keys) - 1)
        c = torch.where(self.keys[at] == k, self.pair_counts[at], torch.zeros((), dtype=torch.float64))
        total, types = self.context_total[hh], self.context_types[hh]
        seen = (h >= 0) & (total > 0)
        return torch.where(seen, (c + types * p) / (total + types).clamp(min=1.0), p)


def count_ngrams(blocks: dict, vocab_size: int, support: torch.Tensor, pad_id: int = 0,
                 k: float = UNIGRAM_K) -> NgramCounts:
    """Unigram and bigram counts of packed ``blocks`` (``input_ids``, ``special_tokens_mask``), row chunk by row chunk:
    targets are the non-special positions, contexts every non-pad left neighbour in the same block. ``support``:
    bool [V], the ids the unigram's add-k spreads over."""
    v = vocab_size
    counts = torch.zeros(v, dtype=torch.float64)
    parts_k, parts_c = [], []
    for ids, sp in zip(iter_rows(blocks["input_ids"]), iter_rows(blocks["special_tokens_mask"])):
        ids, target = torch.as_tensor(ids).long(), ~torch.as_tensor(sp).bool()
        counts += torch.bincount(ids[target], minlength=v)[:v].double()
        ok = target[:, 1:] & (ids[:, :-1] != pad_id)
        u, c = torch.unique(ids[:, :-1][ok] * v + ids[:, 1:][ok], return_counts=True)
        parts_k.append(u)
        parts_c.append(c)
    keys = torch.cat(parts_k) if parts_k else torch.zeros(0, dtype=torch.long)
    pair = torch.cat(parts_c).double() if parts_c else torch.zeros(0, dtype=torch.float64)
    if len(parts_k) > 1:  # merge the chunks' distinct pairs
        keys, inv = torch.unique(keys, return_inverse=True)
        pair = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inv, pair)
    support = support.clone()
    support |= counts > 0
    smoothed = torch.where(support, counts + k, torch.zeros((), dtype=torch.float64))
    h = keys // v
    return NgramCounts(smoothed / smoothed.sum(), keys, pair,
                       torch.zeros(v, dtype=torch.float64).index_add_(0, h, pair),
                       torch.bincount(h, minlength=v)[:v].double(), int(counts.sum()))


def reference_losses(n: NgramCounts, input_ids: torch.Tensor, labels: torch.Tensor, mask_id: int,
                     replace: tuple[float, float, float], sampler_probs: torch.Tensor) -> dict:
    """The references' mean cross-entropy (nats) over the masked positions (``labels != -100``) of fixed masks whose
    model input is ``input_ids``: ``unigram`` and ``bigram`` (seeing the shown token, see the module docstring),
    ``*_blind`` (not), ``*_at_mask`` (the positions shown as ``mask_id``), and ``positions``. ``replace``: the masks'
    ([MASK], random, keep) probabilities; ``sampler_probs``: the random replacements' distribution."""
    sel = labels != -100
    b, j = sel.nonzero(as_tuple=True)
    x = labels[b, j].long()
    s = input_ids[b, j].long()
    left = torch.where(j > 0, input_ids[b, (j - 1).clamp(min=0)].long(), torch.full_like(j, mask_id))
    h = torch.where(left == mask_id, torch.full_like(left, -1), left)
    at_mask = s == mask_id
    _, p_random, p_keep = (float(r) for r in replace)
    u = sampler_probs.double()[s.clamp(max=len(sampler_probs) - 1)]

    def seeing(prior_x: torch.Tensor, prior_s: torch.Tensor) -> torch.Tensor:
        """p(x | context, shown s): the prior at [MASK], the corruption's posterior elsewhere."""
        post = prior_x * (p_keep * (x == s).double() + p_random * u) / (prior_s * p_keep + p_random * u)
        return torch.where(at_mask, prior_x, post)

    nll = lambda p, where=None: float(-(p if where is None else p[where]).log().mean())  # noqa: E731
    pu, pb = n.p[x], n.bigram(h, x)
    ru, rb = seeing(pu, n.p[s]), seeing(pb, n.bigram(h, s))
    out = {"positions": len(x), "left_masked_frac": float((h < 0).double().mean()) if len(x) else float("nan")}
    if not len(x):
        return {**out, **{k: float("nan") for k in ("unigram", "bigram", "unigram_blind", "bigram_blind",
                                                     "unigram_at_mask", "bigram_at_mask")}}
    return {**out, "unigram": nll(ru), "bigram": nll(rb), "unigram_blind": nll(pu), "bigram_blind": nll(pb),
            "unigram_at_mask": nll(pu, at_mask) if at_mask.any() else float("nan"),
            "bigram_at_mask": nll(pb, at_mask) if at_mask.any() else float("nan")}


def _masks_sha(fixed) -> str:
    h = hashlib.sha256()
    for t in (fixed.input_ids, fixed.labels):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cached_reference(d, t, cache_dir: str, tok, train_blocks: dict, fixed, e, unit: str, ctx,
                     sampler_probs: torch.Tensor) -> dict:
    """:func:`reference_losses` of the fixed masks ``fixed`` (a MaskedBatch: model input and labels) under ``eval.*``
    (``e``, first unit ``unit``), counted on ``train_blocks`` of ``data.*`` / ``tokenizer.*`` (``d``, ``t``; ``tok``,
    ``ctx``: the tokenizer and sampler context), once per corpus, tokenizer, block shape and masks (cached under
    ``cache_dir``; the key holds the masks' content hash, so any change of ``eval.*`` or of the validation blocks is
    another entry). The returned dict also says where the entry is (``cache``) and whether this call built it
    (``built``)."""
    from mlmlab.data.cache import plain
    from mlmlab.data.tokenizer import MASK, PAD
    from mlmlab.data.vocab_stats import train_blocks_key

    replace = plain(e.replace)
    key = {"kind": "ngram_reference", "version": VERSION, "unigram_k": UNIGRAM_K, "smoothing": "witten_bell",
           "train": train_blocks_key(d, t, tok, train_blocks),
           "eval": {"rate": e.rate, "seed": e.seed, "replace": replace, "unit": unit},
           "masks": {"shape": list(fixed.labels.shape), "sha256": _masks_sha(fixed)}}
    built = False

    def build(tmp: Path) -> None:
        nonlocal built
        support = ctx.allowed().clone()
        if ctx.unk_id is not None and 0 <= ctx.unk_id < len(support):
            support[ctx.unk_id] = True
        n = count_ngrams(train_blocks, tok.get_vocab_size(), support, PAD)
        out = reference_losses(n, fixed.input_ids, fixed.labels, MASK,
                               (replace["mask"], replace["random"], replace["keep"]), sampler_probs)
        tmp.write_text(json.dumps({**out, "train_tokens": n.tokens, "bigram_types": len(n.keys),
                                   "unigram_k": UNIGRAM_K, "smoothing": "witten_bell"}))
        built = True

    path = cached_file(cache_dir, "ngram_reference", key, "reference.json", build)
    out = json.loads(path.read_text())
    log.info("n-gram references %s (%s): unigram %.4f, bigram %.4f nats on %d masked positions",
             "computed" if built else "reused", path.parent, out["unigram"], out["bigram"], out["positions"])
    return {**out, "cache": str(path.parent), "built": built}
