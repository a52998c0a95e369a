"""Select positions, apply the [MASK]/random/keep replacement, build labels. Vectorized, on the batch's device.

Randomness comes only from the ``torch.Generator`` passed in. In training it is seeded from (seed, rank, step, micro-batch)
by :func:`make_generator`, so the mask stream is reproducible, differs across DDP ranks, and needs no state in a
checkpoint: resuming at step k regenerates exactly the masks step k would have had.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100
NOT_SELECTED, MASKED, RANDOM, KEPT = 0, 1, 2, 3


def mask_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integer parts, e.g. (seed, rank, step, micro); no collisions between tuples."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def make_generator(device: torch.device | str, *parts: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(mask_seed(*parts))
    return g


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # corrupted ids
    labels: torch.Tensor  # original id where selected, IGNORE_INDEX elsewhere
    kind: torch.Tensor  # int8: NOT_SELECTED / MASKED / RANDOM / KEPT per position


class BertMasker:
    """BERT's recipe: select each non-special token with probability ``rate``; of the selected, replace a ``mask``
    share with [MASK], a ``random`` share with a sampled id, keep the rest unchanged. Ratios must sum to 1."""

    def __init__(self, mask_token_id: int, mask: float, random: float, keep: float, sampler):
        if min(mask, random, keep) < 0 or abs(mask + random + keep - 1.0) > 1e-6:
            raise ValueError(f"replacement ratios must be >= 0 and sum to 1, got mask={mask} random={random} keep={keep}")
        self.mask_token_id = mask_token_id
        self.p_mask, self.p_random = float(mask), float(random)
        self.sampler = sampler

    def __call__(self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, rate: float,
                 generator: torch.Generator) -> MaskedBatch:
        dev = input_ids.device
        ids = input_ids.long()
        u = torch.rand(ids.shape, generator=generator, device=dev)
        selected = (u < rate) & ~special_tokens_mask
        # a second uniform decides the replacement of each selected position
        v = torch.rand(ids.shape, generator=generator, device=dev)
        to_mask = selected & (v < self.p_mask)
        to_random = selected & (v >= self.p_mask) & (v < self.p_mask + self.p_random)
        corrupted = ids.masked_fill(to_mask, self.mask_token_id)
        # drawn for every position and used where needed: no host sync on an accelerator
        corrupted = torch.where(to_random, self.sampler.sample(ids.shape, generator, dev), corrupted)
        kind = torch.zeros(ids.shape, dtype=torch.int8, device=dev)
        kind[selected] = KEPT
        kind[to_mask] = MASKED
        kind[to_random] = RANDOM
        labels = ids.masked_fill(~selected, IGNORE_INDEX)
        return MaskedBatch(corrupted, labels, kind)


def telemetry(original: torch.Tensor, special_tokens_mask: torch.Tensor, out: MaskedBatch) -> dict[str, torch.Tensor]:
    """Realized corruption of one batch: what was actually done, to compare with what was asked for."""
    selected = out.kind != NOT_SELECTED
    n_sel = selected.sum().clamp(min=1).float()
    n_eligible = (~special_tokens_mask).sum().clamp(min=1).float()
    random_pos = out.kind == RANDOM
    return {
        "selected_frac": selected.sum() / n_eligible,
        "mask_frac": (out.kind == MASKED).sum() / n_sel,
        "random_frac": random_pos.sum() / n_sel,
        "keep_frac": (out.kind == KEPT).sum() / n_sel,
        "random_equals_original": (random_pos & (out.input_ids == original.long())).sum()
        / random_pos.sum().clamp(min=1).float(),
        "special_selected": (selected & special_tokens_mask).sum().float(),
    }


def mask_once(input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, rate: float, mask_token_id: int,
              replace: tuple[float, float, float], sampler, seed: int) -> MaskedBatch:
    """Mask a whole tensor once with its own seed: the fixed evaluation masks, identical for every run that shares
    the validation data and these arguments -- whatever the training mask rate."""
    g = make_generator(input_ids.device, seed)
    return BertMasker(mask_token_id, *replace, sampler=sampler)(input_ids, special_tokens_mask, rate, g)
