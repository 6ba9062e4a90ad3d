"""Blocking calls made from plain Python threads of one process (a background run is one)."""
from __future__ import annotations

import threading

import pytest

import gpusession as gs


def _rank_sum(x):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    return float(t.item())


@pytest.mark.slow
def test_blocking_calls_from_plain_threads_more_than_fit_at_once_all_return_their_own_values(cluster):
    """Three calls of 2 GPUs from three threads on 4 GPUs (one waits in the queue), twice in a
    row, with the default console renderer: each returns its own value and every GPU is free
    after (the autouse no_leaked_gpus check)."""
    train = gs.distributed(gpus=2)(_rank_sum)
    results: dict[int, object] = {}

    def call(i):
        try:
            results[i] = train(i)
        except BaseException as exc:  # noqa: BLE001 - the assertion shows it
            results[i] = exc

    for _round in range(2):
        results.clear()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results == {i: 2.0 * i for i in range(3)}, results
