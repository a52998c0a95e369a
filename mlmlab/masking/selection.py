"""Weighted selection (``mask.select.*``): each unit is selected with a probability proportional to a weight of its
tokens' types instead of uniformly, with the expected rate still ``mask.rate``.

A weight table is a float vector over the vocabulary (zero at the special ids); a unit's weight is the mean of its
tokens' weights. How the weights become selections keeps each count rule's meaning (mlmlab.masking.masker):

- ``bernoulli``: every unit independently with ``p_u = min(1, c * w_u)``, ``c`` per sequence such that the ``p_u`` sum
  to ``rate x units`` (water-filling: units whose probability would pass 1 are capped at 1 and the rest share what is
  left), so the expected rate is ``mask.rate`` unless the weights are too uneven for it (then every unit with a weight is
  taken);
- ``exact`` / ``prob_round``: the same budget as uniform selection, units taken in the order of ``-log(u) / w_u`` --
  sequential sampling without replacement with probability proportional to the weight (Efraimidis & Spirakis 2006) --
  until the budget is met.

The tables (:func:`build_weights`):

- ``idf``: ``log((N + 1) / (df + 1)) + 1`` with ``df`` the number of training blocks holding the type and ``N`` the
  blocks (scikit-learn's smoothed idf; a 64-token block stands for a document);
- ``domain``: ``((c_dom + k) / (N_dom + kV)) / ((c_ref + k) / (N_ref + kV))``, how much more frequent the type is in the
  domain corpus than in the reference (the anchors of Difference-Masking, Wilf et al. 2023, as a frequency ratio);
- ``loss`` (:class:`LossWeights`): a running per-type mean of the model's own MLM loss on the positions it predicted,
  updated after every training step (adaptive masking, Edman & Fraser 2025), starting uniform at ``log V``.

``mask.select.power`` raises every weight to a power first (0: uniform). Pure torch: the counts come through the
:class:`~mlmlab.masking.replacement.SamplerContext`.
"""

from __future__ import annotations

import math

import torch

WATER_FILL_ROUNDS = 12  # enough for any block length used here: each round caps at least one more unit or stops


def selection_probs(w: torch.Tensor, exists: torch.Tensor, rate: float) -> torch.Tensor:
    """``p`` (B, U): ``min(1, c_b * w)`` over existing units with ``sum_u p = rate x (existing units)`` per row, by
    water-filling; rows whose weights are all zero fall back to uniform ``rate``."""
    w = torch.where(exists, w.double().clamp(min=0), torch.zeros((), dtype=torch.float64, device=w.device))
    n = exists.sum(1, keepdim=True).double()
    zero_rows = (w.sum(1, keepdim=True) <= 0)
    w = torch.where(zero_rows & exists, torch.ones_like(w), w)
    target = rate * n
    capped = torch.zeros_like(exists)
    p = torch.zeros_like(w)
    for _ in range(WATER_FILL_ROUNDS):
        free = (w * (~capped)).sum(1, keepdim=True)
        need = (target - capped.sum(1, keepdim=True)).clamp(min=0)
        c = torch.where(free > 0, need / free.clamp(min=1e-300), torch.zeros_like(free))
        p = torch.where(capped, torch.ones_like(w), c * w)
        capped = capped | (p >= 1)
    return p.clamp(max=1.0) * exists


def unit_weights(token_w: torch.Tensor, uid: torch.Tensor, ulen: torch.Tensor) -> torch.Tensor:
    """Mean token weight per unit slot (B, L): ``uid`` per position (-1: not a candidate), ``ulen`` tokens per unit."""
    b, n = uid.shape
    s = torch.zeros((b, n + 1), dtype=torch.float64, device=uid.device)
    s.scatter_add_(1, uid.clamp(min=-1) + 1, token_w.double() * (uid >= 0))
    return s[:, 1:] / ulen.clamp(min=1)


class WeightTable:
    """A fixed weight per type (idf, domain); ``report`` says what it is."""

    def __init__(self, name: str, weights: torch.Tensor, special_ids: tuple[int, ...], power: float = 1.0,
                 report: dict | None = None):
        w = weights.double().clamp(min=0) ** power
        w[[i for i in special_ids if 0 <= i < len(w)]] = 0.0
        self.name, self._w, self.report = name, w.float(), report or {}
        self._dev: dict = {}

    def table(self, device) -> torch.Tensor:
        key = str(device)
        if key not in self._dev:
            self._dev[key] = self._w.to(device)
        return self._dev[key]

    def token_weights(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids.device)[ids]


class LossWeights(WeightTable):
    """``mask.select.weight=loss``: each type's running mean MLM loss on the positions the model predicted,
    ``L[t] <- L[t] + (1 - decay) (mean loss of t in the batch - L[t])`` after every training step (types absent from
    the batch keep theirs), starting at ``log V`` (a uniform predictor) for every type. The state travels in the
    checkpoint (exact resume)."""

    def __init__(self, vocab_size: int, special_ids: tuple[int, ...], decay: float = 0.99, power: float = 1.0):
        super().__init__("loss", torch.full((vocab_size,), math.log(vocab_size)), special_ids, 1.0)
        self.decay, self.power, self.special_ids = float(decay), float(power), special_ids
        self.loss = torch.full((vocab_size,), math.log(vocab_size), dtype=torch.float32)
        self.updates = 0

    def table(self, device) -> torch.Tensor:
        if self.loss.device != torch.device(device):
            self.loss = self.loss.to(device)
        w = self.loss.clamp(min=0) ** self.power if self.power != 1.0 else self.loss.clamp(min=0)
        sp = torch.tensor([i for i in self.special_ids if 0 <= i < len(w)], device=w.device, dtype=torch.long)
        return w.index_fill(0, sp, 0.0)

    @torch.no_grad()
    def update(self, targets: torch.Tensor, losses: torch.Tensor) -> None:
        """One training step's predicted ``targets`` (ids) and their per-token ``losses``."""
        if targets.numel() == 0:
            return
        self.loss = self.loss.to(targets.device)
        v = len(self.loss)
        s = torch.zeros(v, device=targets.device, dtype=torch.float32).index_add_(0, targets, losses.float())
        c = torch.zeros(v, device=targets.device, dtype=torch.float32).index_add_(0, targets, torch.ones_like(
            losses, dtype=torch.float32))
        seen = c > 0
        mean = s / c.clamp(min=1)
        self.loss = torch.where(seen, self.loss + (1 - self.decay) * (mean - self.loss), self.loss)
        self.updates += 1

    def reset(self) -> None:
        """Back to the uniform start (after a timing probe trained on the same recipe)."""
        self.loss = torch.full_like(self.loss, math.log(len(self.loss)))
        self.updates = 0

    def state(self) -> dict:
        return {"loss": self.loss.detach().cpu().clone(), "updates": self.updates}

    def load(self, state: dict) -> None:
        self.loss, self.updates = state["loss"].clone().float(), int(state["updates"])
        self.report = {"updates": self.updates}


def idf_weights(doc_freq: torch.Tensor, n_docs: int) -> torch.Tensor:
    return torch.log((n_docs + 1) / (doc_freq.double() + 1)) + 1.0


def domain_ratio(c_dom: torch.Tensor, c_ref: torch.Tensor, allowed: torch.Tensor, k: float = 1.0) -> torch.Tensor:
    v = int(allowed.sum())
    d, r = c_dom.double() * allowed, c_ref.double() * allowed
    return ((d + k) / (d.sum() + k * v)) / ((r + k) / (r.sum() + k * v))


def build_weights(select, ctx) -> WeightTable | None:
    """``mask.select`` (a :class:`~mlmlab.masking.config.SelectConfig`) with the data context ``ctx`` -> the run's
    weight table; None for ``uniform``."""
    kind = select.weight
    if kind == "uniform":
        return None
    special = ctx.special_ids
    if kind == "loss":
        return LossWeights(ctx.vocab_size, special, select.decay, select.power)
    allowed = ctx.allowed()
    if kind == "idf":
        df_fn = ctx.need("doc_freq", "select.weight=idf", "the training blocks' document frequencies")
        df, n = df_fn()
        w = idf_weights(df, n)
        return WeightTable("idf", w, special, select.power,
                           {"blocks": int(n), "idf_min": float(w[allowed].min()), "idf_max": float(w[allowed].max())})
    # domain
    counts = ctx.need("corpus_counts", "select.weight=domain", "corpus_counts")
    train = ctx.need("token_counts", "select.weight=domain", "the training corpus's token counts")
    c_dom = counts(str(select.corpus), "mask.select.corpus") if select.corpus is not None else train()
    c_ref = counts(str(select.reference), "mask.select.reference") if select.reference is not None else train()
    w = domain_ratio(c_dom, c_ref, allowed, select.smoothing)
    seen = allowed & (c_dom > 0)
    top = torch.topk(torch.where(seen, w, torch.zeros_like(w)), k=min(10, int(seen.sum()))).indices
    return WeightTable("domain", w, special, select.power,
                       {"ratio_max": float(w[seen].max()) if seen.any() else float("nan"),
                        "ratio_median": float(w[seen].median()) if seen.any() else float("nan"),
                        "top_ids": [int(i) for i in top]})
