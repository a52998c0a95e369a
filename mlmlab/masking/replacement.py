"""Samplers for the ids that replace the "random" share of selected positions."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class UniformSampler:
    """Uniform over the vocabulary minus the special ids: [PAD]/[CLS]/[SEP]/[MASK]/[UNK] are never drawn."""

    def __init__(self, vocab_size: int, special_ids: Iterable[int]):
        special = set(int(i) for i in special_ids)
        self.allowed = torch.tensor([i for i in range(vocab_size) if i not in special], dtype=torch.long)
        if len(self.allowed) == 0:
            raise ValueError(f"no non-special ids to draw from (vocab_size={vocab_size}, special={sorted(special)})")
        self._on: dict[torch.device, torch.Tensor] = {}

    def sample(self, shape: tuple[int, ...] | torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        allowed = self._on.get(device)
        if allowed is None:
            allowed = self._on[device] = self.allowed.to(device)
        idx = torch.randint(len(allowed), tuple(shape), generator=generator, device=device)
        return allowed[idx]
