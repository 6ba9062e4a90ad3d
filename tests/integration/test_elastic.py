"""The shared-cluster scenario on the session's 4 logical GPUs: an elastic low-priority run gives
a high-priority run the 2 GPUs it needs, keeps training on the other 2, and grows back to 4 once
they are free again, without losing or repeating a step."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
import torch

import gpusession as gs
from gpusession.broker import client
from gpusession.observe.events import RunInfo
from gpusession.identity import Identity
from gpusession.run.caller.lease import Lease
from gpusession.run.caller.options import validate_run_options

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for
from .elastic_train import expected_weights, train

GRACE_S = 3.0  # preemption_grace_s of the session broker (tests/conftest.py)
MARGIN_S = 2.0
GROW_TARGET_S = 10.0  # SPEC: back at full size within 10 s of the GPUs freeing up
GROW_MARGIN_S = 5.0  # a loaded 2-core machine: restarting 4 ranks can take seconds more


def rank_sum() -> float:
    import torch.distributed as dist

    value = torch.tensor([float(gs.context().rank + 1)])
    dist.all_reduce(value)
    return value.item()


@pytest.fixture
def boss(broker, admin):
    user = f"boss-{uuid.uuid4().hex[:6]}"
    client.call(broker.set_quota, user, {"max_priority": "high"}, admin)
    yield user
    client.call(broker.reset_quota, user, admin)


def _sizes(history: list[dict]) -> list[int]:
    """The world sizes the run went through, in order, each once."""
    sizes: list[int] = []
    for report in history:
        if not sizes or sizes[-1] != report["world_size"]:
            sizes.append(report["world_size"])
    return sizes


def test_an_elastic_run_shrinks_for_a_higher_priority_run_and_grows_back_without_losing_a_step(
        cluster, broker, admin, boss, tmp_path):
    stop_file = str(tmp_path / "stop")
    info = RunInfo()
    elastic = Lease(validate_run_options(gpus=4, min_gpus=2, priority="low"),
                    identity=Identity(f"elastic-{uuid.uuid4().hex[:6]}"), info=info)
    outcome: dict = {}

    def run_a() -> None:
        try:
            with elastic.acquire():
                outcome["result"] = elastic.run(train, stop_file)
        except BaseException as exc:  # noqa: BLE001 - the test reports it below
            outcome["error"] = exc

    a = threading.Thread(target=run_a)
    a.start()
    try:
        wait_for(lambda: len(info.history) >= 3 or "error" in outcome, timeout=90, message="A training on 4 GPUs")
        assert info.history[-1]["world_size"] == 4

        asked = time.monotonic()
        high = Lease(validate_run_options(gpus=2, priority="high"), identity=Identity(boss)).acquire()
        try:
            placed_after = time.monotonic() - asked  # B's group exists in Ray: A gave up 2 GPUs
            shrunk_at = len(info.history)
            wait_for(lambda: sum(r["world_size"] == 2 for r in info.history[shrunk_at:]) >= 3,
                     timeout=30, message="A training on 2 GPUs while B runs")
            assert high.run(rank_sum) == 3.0
        finally:
            high.release()
        freed = time.time()
        wait_for(lambda: info.history[-1]["world_size"] == 4, timeout=GROW_TARGET_S + GROW_MARGIN_S + 5,
                 message="A back on 4 GPUs")
        back = next(r for r in info.history if r["at"] > freed and r["world_size"] == 4)
        wait_for(lambda: len(info.history) >= info.history.index(back) + 3, timeout=30, message="A going on at 4")
    finally:
        open(stop_file, "w").close()
        a.join(120)

    assert "error" not in outcome, repr(outcome.get("error"))
    assert placed_after < GRACE_S + MARGIN_S
    assert back["at"] - freed < GROW_TARGET_S + GROW_MARGIN_S
    steps = [r["step"] for r in info.history]
    assert steps == list(range(len(steps)))  # none repeated, none lost
    assert _sizes(info.history) == [4, 2, 4]
    assert all(r["shard"] == 8 // r["world_size"] for r in info.history)  # prepare_loader resharded
    result = outcome["result"]
    assert result["steps"] == len(steps)
    expected = expected_weights(result["steps"])
    assert all(torch.allclose(result["weights"][k], expected[k], atol=1e-5) for k in expected)
    assert info.resizes == 2 and info.restarts == 0 and info.steps_lost == 0
    shrink, grow = info.transitions
    assert shrink.startswith(f"preempted by lease {high.lease_id} ({boss}, high): 4 -> 2 GPUs from the checkpoint "
                             "after step ")
    assert grow.startswith("4 GPUs again from the checkpoint after step ")
    assert free_gpus() == CLUSTER_GPUS


def test_a_held_elastic_lease_shrinks_and_grows_back_between_runs(cluster, broker, boss):
    """gs.lease(min_gpus=...) held with no run going: the shrink is made when the broker asks
    (waiting for the next run would miss the grace period and lose the whole lease), and freed
    GPUs are taken back at once; each run sees the size of that moment."""
    held = gs.lease(gpus=4, min_gpus=2, priority="low")
    try:
        assert held.run(rank_sum) == 10.0  # ranks 1 + 2 + 3 + 4
        asked = time.monotonic()
        high = Lease(validate_run_options(gpus=2, priority="high"), identity=Identity(boss)).acquire()
        try:
            placed_after = time.monotonic() - asked
            assert held.workers == 2  # shrunk, not taken back
            # The run waits for the idle watcher's resize to finish (its receipt is written after the
            # broker's answer, which also granted `high`): only then is info certain to show it.
            assert held.run(rank_sum) == 3.0  # 2 ranks now
            assert held.info.workers == 2
            assert held.info.transitions == [
                f"preempted by lease {high.lease_id} ({boss}, high): 4 -> 2 GPUs between runs"]
        finally:
            high.release()
        freed = time.monotonic()
        wait_for(lambda: held.workers == 4, timeout=GROW_TARGET_S + GROW_MARGIN_S, message="the held lease back at 4")
        grown_after = time.monotonic() - freed
        assert held.run(rank_sum) == 10.0
    finally:
        held.release()
    assert placed_after < GRACE_S + MARGIN_S
    assert grown_after < GROW_TARGET_S + GROW_MARGIN_S
    assert held.info.resizes == 2
    assert held.info.transitions == ["4 GPUs again between runs"]  # the last run's record
    assert free_gpus() == CLUSTER_GPUS
