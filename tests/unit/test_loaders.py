"""gs.prepare_loader's loader without a cluster: which epoch each pass iterates, and which epoch
a restarted attempt must iterate first (run/rank/loaders.py; the run carries it, test_checkpoints.py)."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from gpusession.run.rank.loaders import distributed_loader

ITEMS = list(range(8))  # 2 ranks: 4 items each, 2 batches of 2 per epoch


def prepared(epoch: int = 0):
    return distributed_loader(DataLoader(ITEMS, batch_size=2, shuffle=True), rank=0, world_size=2, epoch=epoch)


def order(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_each_pass_is_the_next_epoch_shuffled_as_set_epoch_would_and_a_loader_can_start_at_any_epoch():
    loader = prepared()
    passes = [order(loader) for _ in range(3)]
    assert len({str(p) for p in passes}) == 3  # each epoch shuffled differently
    assert order(prepared(epoch=2)) == passes[2]  # what a resumed attempt's loader iterates first


def test_a_commit_mid_epoch_resumes_that_epoch_and_one_after_its_last_batch_the_next():
    loader = prepared()
    assert loader.resume_epoch() == 0  # nothing iterated yet
    for _ in loader:  # epoch 0 done
        pass
    assert loader.resume_epoch() == 1
    batches = iter(loader)  # epoch 1
    next(batches)
    assert loader.resume_epoch() == 1  # a batch of it remains: that epoch again
    next(batches)
    assert loader.resume_epoch() == 2  # its last batch was given out: the next epoch
    for _ in loader:  # epoch 2, left after its first batch
        break
    assert loader.resume_epoch() == 3


def test_an_explicit_sampler_set_epoch_before_a_pass_wins_and_counting_goes_on_from_it():
    loader = prepared()
    expected = [order(prepared(epoch=e)) for e in (5, 6)]
    loader.sampler.set_epoch(5)  # the torch idiom: for epoch in range(start, n): sampler.set_epoch(epoch)
    assert [order(loader), order(loader)] == expected
    assert loader.resume_epoch() == 7


def test_batches_go_to_the_device_given():
    loader = distributed_loader(DataLoader(ITEMS, batch_size=2), rank=1, world_size=2, device=torch.device("cpu"))
    assert [b.tolist() for b in loader] == [[1, 3], [5, 7]]  # rank 1's shard, in order when not shuffled
