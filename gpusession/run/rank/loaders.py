"""gs.prepare_loader's loader: a DataLoader resharded for the world size, whose sampler's epoch
advances on every pass, and which knows the epoch a restarted attempt should iterate first.

No gpusession state here: context.py gives it the rank, world size, device and the epoch to
start from (tested without a cluster in tests/unit/test_loaders.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def distributed_loader(loader, *, rank: int, world_size: int, device: Any = None, epoch: int = 0) -> EpochLoader:
    """`loader` rebuilt with a DistributedSampler (shuffled if `loader` shuffles), its first
    pass at `epoch`; batches moved to `device` unless it is None."""
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank,
                                 shuffle=shuffle, drop_last=loader.drop_last)
    rebuilt = DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler,
        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, drop_last=loader.drop_last,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers if loader.num_workers else False,
    )
    return EpochLoader(rebuilt, sampler, device, epoch)


class EpochLoader:
    def __init__(self, loader, sampler, device, epoch: int = 0) -> None:
        self.loader, self.sampler, self.device = loader, sampler, device
        self.dataset, self.batch_size = loader.dataset, loader.batch_size
        self.epoch = epoch  # the next pass's
        self._told = epoch  # what this loader last gave sampler.set_epoch
        sampler.set_epoch(epoch)
        self._in_pass: int | None = None  # the epoch of the pass being iterated
        self._given = 0  # batches of that pass given out

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        if self.sampler.epoch != self._told:  # the function called sampler.set_epoch(n): n it is
            self.epoch = self.sampler.epoch
        epoch, self.epoch = self.epoch, self.epoch + 1
        self.sampler.set_epoch(epoch)
        self._told = epoch
        return self._pass(epoch)

    def _pass(self, epoch: int) -> Iterator:
        self._in_pass, self._given = epoch, 0
        try:
            for batch in self.loader:
                self._given += 1
                yield _to_device(batch, self.device) if self.device is not None else batch
        finally:  # exhausted, or left early (break): the pass is over either way
            if self._in_pass == epoch:
                self._in_pass = None

    def resume_epoch(self) -> int:
        """The epoch a restarted attempt iterates first: the pass in progress while batches of it
        remain (a commit mid-epoch), else the next one (a commit after a pass's last batch)."""
        if self._in_pass is not None and self._given < len(self.loader):
            return self._in_pass
        return self.epoch


def _to_device(batch, device):
    if hasattr(batch, "to"):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
