"""Background runs (`train.submit(...)`): real Ray cluster, real broker, real gloo ranks."""
from __future__ import annotations

import asyncio
import time

import pytest

import gpusession as gs
from gpusession.api.background import RunStatus
from tests.conftest import CLUSTER_GPUS, free_gpus, wait_for


def _slow_sum(x, steps=1, pause=0.0):
    import time

    import torch
    import torch.distributed as dist

    for step in range(steps):
        gs.report({"step": step})
        time.sleep(pause)
    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    return float(t.item())


def _fails():
    raise ValueError("bad batch")


@pytest.mark.slow
def test_submit_returns_at_once_and_two_runs_give_their_results_with_metrics(cluster, quiet):
    train = gs.distributed(gpus=2)(_slow_sum)
    asked = time.monotonic()
    first, second = train.submit(1, steps=3, pause=0.3), train.submit(2, steps=3, pause=0.3)
    returned = time.monotonic() - asked
    assert returned < 1.0, f"submit took {returned:.2f} s (bound 1 s: it must not wait for GPUs)"
    assert not first.done() and first.state is not RunStatus.FINISHED
    assert gs.runs()[:2] == [second, first], "gs.runs() lists the newest first"
    assert first.result(180) == 2.0 and second.result(180) == 4.0
    assert first.state is RunStatus.FINISHED and first.done()
    assert [row["step"] for row in first.metrics] == [0, 1, 2]
    assert first.info.lease_id != second.info.lease_id and first.info.released


@pytest.mark.slow
def test_a_failing_background_run_raises_the_blocking_calls_error_type_from_result(cluster, quiet):
    train = gs.distributed(gpus=2)(_fails)
    run = train.submit()
    with pytest.raises(gs.WorkerFailed, match="bad batch") as caught:
        run.result(180)
    assert caught.value.remote_type == "ValueError"
    assert run.state is RunStatus.FAILED
    with pytest.raises(gs.WorkerFailed) as blocking:
        train()
    assert type(blocking.value) is type(caught.value)


@pytest.mark.slow
def test_cancel_frees_the_gpus_in_ray_within_a_second(cluster, quiet):
    train = gs.distributed(gpus=2)(_slow_sum)
    run = train.submit(1, steps=600, pause=0.1)
    wait_for(lambda: run.state is RunStatus.RUNNING and run.metrics, timeout=180, message="the run running")
    assert free_gpus() == CLUSTER_GPUS - 2
    cancelled_at = time.monotonic()
    assert run.cancel()
    wait_for(lambda: free_gpus() == CLUSTER_GPUS, timeout=5, interval=0.01, message="GPUs free after cancel")
    freed = time.monotonic() - cancelled_at
    assert freed <= 1.0, f"GPUs free in Ray {freed:.2f} s after cancel() (bound 1 s, from the call)"
    with pytest.raises(gs.RunCancelled):
        run.result(30)
    assert run.state is RunStatus.CANCELLED and run.info.end_reason == "cancelled"


@pytest.mark.slow
def test_a_run_over_the_free_gpus_queues_with_its_position_and_starts_when_one_ends(cluster, quiet):
    train = gs.distributed(gpus=2)(_slow_sum)
    holding = [train.submit(i, steps=3000, pause=0.1) for i in range(2)]
    try:
        wait_for(lambda: all(r.state is RunStatus.RUNNING for r in holding), timeout=180, message="both running")
        third = train.submit(5)
        wait_for(lambda: third.position is not None, timeout=60, message="the third run queued")
        assert third.state is RunStatus.QUEUED and third.position == 1
        assert "position 1 in the queue" in repr(third)
        holding[0].cancel()
        assert third.result(240) == 10.0, "the queued run starts once a run ends, and finishes"
        assert holding[1].state is RunStatus.RUNNING, "the other run was never disturbed"
    finally:
        for run in holding:
            run.cancel()
        for run in holding:
            run.wait(60)


@pytest.mark.slow
def test_a_run_is_awaitable(cluster, quiet):
    train = gs.distributed(gpus=1)(_slow_sum)

    async def main():
        return await train.submit(3)

    assert asyncio.run(main()) == 3.0
