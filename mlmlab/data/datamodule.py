"""LightningDataModule over packed blocks: shuffled training blocks, fixed-mask validation blocks."""

from __future__ import annotations

import logging

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from mlmlab.data.tokenizer import PAD

log = logging.getLogger(__name__)


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
        # the training order (the same as DataLoader(shuffle=True) with this seed) and its position, which
        # mlmlab.guard.Guard saves in checkpoints so that a resumed run continues at the next batch
        self.sampler = ResumableSampler(len(self.train_set), batch_size, seed, persistent_workers=num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        kw = {"batch_size": self.batch_size, "drop_last": True, "num_workers": self.num_workers,
              "persistent_workers": self.num_workers > 0}
        t = self.trainer
        if t is not None and t.world_size > 1:  # DDP: Lightning puts a DistributedSampler over the shuffled order
            log.warning("trainer.world_size=%d: a resumed run restarts the data order of its epoch (exact data-order "
                        "resume is single-process only)", t.world_size)
            return DataLoader(self.train_set, shuffle=True, generator=torch.Generator().manual_seed(self.seed), **kw)
        return DataLoader(self.train_set, sampler=self.sampler, generator=torch.Generator().manual_seed(self.seed + 1),
                          **kw)

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


class ResumableSampler(Sampler[int]):
    """Shuffled indices with a position that survives a restart: ``(epoch, start)`` says which epoch the next
    ``__iter__`` yields and how many batches of it to skip. ``__len__`` stays the full epoch, so Lightning's batch
    counters are those of an uninterrupted run.

    The order is bit for bit that of ``DataLoader(shuffle=True, generator=Generator().manual_seed(seed))`` (what the
    data module used before): per epoch that loader draws one int64 from the generator (its iterator's base seed; only
    for the first epoch with persistent workers) and then ``randperm(n)``. Here the generator is replayed up to the
    epoch asked for, so a resumed run gets epoch e's permutation without having run epochs 0..e-1."""

    def __init__(self, n: int, batch_size: int, seed: int, persistent_workers: bool = False):
        self.n, self.batch_size, self.seed, self.persistent = n, batch_size, seed, persistent_workers
        self.epoch, self.start = 0, 0  # what the next __iter__ yields
        self.current = (0, 0)  # (epoch, start) of the iteration in progress
        self._g, self._g_epoch = None, -1  # generator positioned before epoch _g_epoch's draws

    def __len__(self) -> int:
        return self.n

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._g is None or self._g_epoch > epoch:
            self._g, self._g_epoch = torch.Generator().manual_seed(self.seed), 0
        while True:
            if self._g_epoch == 0 or not self.persistent:
                torch.empty((), dtype=torch.int64).random_(generator=self._g)  # the DataLoader iterator's base seed
            perm = torch.randperm(self.n, generator=self._g)
            # RandomSampler's trailing randperm(n)[:0], drawn when an epoch is used up (drop_last batching always does)
            torch.randperm(self.n, generator=self._g)
            self._g_epoch += 1
            if self._g_epoch > epoch:
                return perm

    def __iter__(self):
        epoch, start = self.epoch, self.start
        if start >= self.n // self.batch_size:  # the saved position was an epoch's end (drop_last batches)
            epoch, start = epoch + 1, 0
        self.current = (epoch, start)
        self.epoch, self.start = epoch + 1, 0
        return iter(self.permutation(epoch)[start * self.batch_size:].tolist())

    def state_dict(self, batches_done: int) -> dict:
        return {"epoch": self.current[0], "start": self.current[1] + batches_done}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.start = int(state["epoch"]), int(state["start"])
