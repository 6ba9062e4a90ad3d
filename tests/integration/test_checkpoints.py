"""Checkpoints are kept by the caller, survive worker death, and feed `resume()`."""
from __future__ import annotations

import os

import pytest

import gpusession as gs


def _count_to(target, crash_flag, crash_after_step=2):
    """One step per batch of a shuffled loader of 8 items (2 ranks: 2 batches of 2 per epoch);
    returns rank 0's batches in order. Rank 0 dies once, right after committing a step."""
    from torch.utils.data import DataLoader

    loader = gs.prepare_loader(DataLoader(list(range(8)), batch_size=2, shuffle=True))
    state = gs.load_checkpoint() or {"step": 0, "seen": []}
    step = state["step"]
    while step < target:
        done_in_epoch = step % len(loader)  # a restart mid-epoch: those batches are in the checkpoint
        for position, batch in enumerate(loader):
            if position < done_in_epoch:
                continue
            state = {"step": step + 1, "seen": state["seen"] + [batch.tolist()]}
            gs.report(step=step)
            gs.save_checkpoint(state)  # rank 0's object is kept; other ranks' calls do nothing
            if step == crash_after_step and os.path.exists(crash_flag) and gs.context().rank == 0:
                os.remove(crash_flag)
                os._exit(1)  # the worker process dies right after committing
            step += 1
            if step == target:
                break
    return state


def _uninterrupted_order(steps: int) -> list[list[int]]:
    """Rank 0's batches of that loader, epoch after epoch, as an uninterrupted run sees them."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    items = list(range(8))
    sampler = DistributedSampler(items, num_replicas=2, rank=0, shuffle=True)
    seen: list[list[int]] = []
    for epoch in range(steps):
        sampler.set_epoch(epoch)
        seen += [batch.tolist() for batch in DataLoader(items, batch_size=2, sampler=sampler)]
    return seen[:steps]


def test_a_worker_that_dies_is_replaced_and_the_run_continues_from_its_last_checkpoint(cluster, quiet, tmp_path):
    crash_once = str(tmp_path / "crash-once")
    open(crash_once, "w").close()
    count_to = gs.distributed(gpus=2)(_count_to)  # max_failures defaults to 3

    result = count_to(6, crash_once)  # rank 0 dies mid-epoch 1, after its first batch
    assert result["step"] == 6 and result["seen"] == _uninterrupted_order(6)  # epochs 1 and 2 as if never stopped
    run = count_to.last_run
    assert run.restarts == 1 and run.end_reason == "finished" and run.steps_lost == 0
    assert [h["step"] for h in run.history] == [0, 1, 2, 3, 4, 5]  # nothing lost, nothing repeated
    assert len(run.transitions) == 1
    assert run.transitions[0].startswith("rank 0 died on ") and "exit code 1" in run.transitions[0]
    assert "restarting from the checkpoint after step 2 (attempt 2 of 4)" in run.transitions[0]


def test_a_checkpoint_saved_before_a_worker_died_survives_and_resume_continues_from_it(cluster, quiet, tmp_path):
    crash_once = str(tmp_path / "crash-once")
    open(crash_once, "w").close()

    count_to = gs.distributed(gpus=2, max_failures=0)(_count_to)  # no automatic restart: by hand

    with pytest.raises(gs.WorkerFailed):
        count_to(6, crash_once, 3)  # rank 0 dies after the last batch of epoch 1
    expected = _uninterrupted_order(6)
    assert count_to.last_run.checkpoint == {"step": 4, "seen": expected[:4]}
    assert count_to.resume() == {"step": 6, "seen": expected}  # same arguments as before; epoch 2 next
    assert [h["step"] for h in count_to.last_run.history] == [4, 5]  # nothing redone


def test_load_checkpoint_is_none_on_a_fresh_call_and_resume_without_checkpoint_explains(cluster, quiet):
    @gs.distributed(gpus=1)
    def fresh():
        return gs.load_checkpoint()

    assert fresh() is None
    with pytest.raises(gs.GPUSessionError, match="saved none"):
        fresh.resume()


def test_gs_context_outside_a_run_says_where_it_works():
    with pytest.raises(gs.GPUSessionError, match="only works inside a function run by @gs.distributed"):
        gs.context()
