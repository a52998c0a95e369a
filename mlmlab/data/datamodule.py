"""LightningDataModule over packed blocks: shuffled training blocks, fixed-mask validation blocks."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from mlmlab.data.tokenizer import PAD


class DictDataset(Dataset):
    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.n = len(next(iter(tensors.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}


class BlockDataset(DictDataset):
    """Training blocks (memory-mapped): each item gets its attention mask and block id (which keys static masks) on
    the fly, so nothing of corpus size is computed up front."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        item["attention_mask"] = item["input_ids"] != PAD
        item["block_id"] = torch.tensor(i)
        return item


def with_attention_mask(blocks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a batch of :class:`BlockDataset` items holds, for a whole (small) block dict at once."""
    n = len(blocks["input_ids"])  # block_id keys static masks; word_ids feed whole-word / span units
    return {**blocks, "attention_mask": blocks["input_ids"] != PAD, "block_id": torch.arange(n)}


class PretrainDataModule(pl.LightningDataModule):
    """``train``: blocks with input_ids / attention_mask / special_tokens_mask / word_ids (masked on the device).
    ``val``: blocks already masked with the fixed evaluation masks (input_ids corrupted, labels set)."""

    def __init__(self, train: dict[str, torch.Tensor], val: dict[str, torch.Tensor], batch_size: int,
                 val_batch_size: int, seed: int, num_workers: int = 0):
        super().__init__()
        self.train_set = BlockDataset(train)
        self.val_set = DictDataset(val)
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.seed, self.num_workers = seed, num_workers

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True, generator=g,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        t = self.trainer
        sampler = ShardSampler(self.val_set, t.world_size, t.global_rank) if t is not None and t.world_size > 1 else None
        return DataLoader(self.val_set, batch_size=self.val_batch_size, shuffle=False, num_workers=0, sampler=sampler)


class ShardSampler(DistributedSampler):
    """Validation under DDP: rank r reads blocks r, r + world, r + 2 world, ... -- every fixed-mask block exactly once
    (Lightning's default DistributedSampler pads the last shard with repeated blocks, which would weight them twice in
    the synced ``val/*`` means). Being a DistributedSampler, Lightning leaves it as it is."""

    def __init__(self, dataset, num_replicas: int, rank: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self):
        return iter(range(self.rank, len(self.dataset), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.num_replicas))
