"""Gang admission against a real broker: all GPUs or none, queued requests hold nothing."""
from __future__ import annotations

import os
import threading
import time

import pytest

import gpusession as gs
from gpusession.broker import client

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for


def _open_leases(broker, admin):
    return client.call(broker.leases, admin)


def test_two_callers_wanting_3_of_4_gpus_run_one_after_the_other_without_deadlock(cluster, quiet, broker, admin, tmp_path):
    gate = tmp_path / "let-the-first-finish"

    @gs.distributed(gpus=3, queue_timeout="120s")
    def hold_until(path):
        import time as t

        while path and not os.path.exists(path):
            t.sleep(0.02)
        return gs.context().lease_id

    results: dict[str, int] = {}
    first = threading.Thread(target=lambda: results.__setitem__("first", hold_until(str(gate))))
    first.start()
    second = threading.Thread(target=lambda: results.__setitem__("second", hold_until("")))
    try:
        wait_for(lambda: any(l["state"] == "placed" for l in _open_leases(broker, admin)), timeout=60,
                 message="the first 3-GPU lease placed")
        second.start()
        queued = wait_for(lambda: [l for l in _open_leases(broker, admin) if l["state"] == "queued"], timeout=30,
                          message="the second request queued")
        assert queued[0]["position"] == 1 and "capacity" in queued[0]["reason"]
        # the queued request holds nothing: Ray shows only the first lease's 3 GPUs in use (Ray's
        # resource view follows a group's creation by up to a few hundred ms: it is waited for, not sampled)
        wait_for(lambda: free_gpus() == CLUSTER_GPUS - 3, timeout=10,
                 message=f"Ray showing {CLUSTER_GPUS - 3} GPU free (the first lease's 3 in use, the queued one none)")
    finally:  # on every path: a caller left waiting on the gate would hold 3 GPUs for later tests
        gate.touch()
        first.join(60)
        if second.ident is not None:
            second.join(60)
    assert set(results) == {"first", "second"} and results["first"] != results["second"]


def test_asking_for_more_gpus_than_the_cluster_has_fails_within_5_s_with_infeasible(cluster, quiet):
    @gs.distributed(gpus=5)
    def too_big():
        return "never runs"

    started = time.monotonic()
    with pytest.raises(gs.Infeasible) as error:
        too_big()
    took = time.monotonic() - started
    assert took < 5, f"Infeasible after {took:.2f} s: bound 5 s from the call (no queueing), loaded machine"
    assert "5 GPUs" in str(error.value) and "4" in str(error.value)
    assert free_gpus() == CLUSTER_GPUS


def test_queue_timeout_gives_up_leasing_nothing(cluster, quiet, broker, admin):
    with gs.lease(gpus=4):
        @gs.distributed(gpus=1, queue_timeout=1)
        def waits():
            return "never runs"

        started = time.monotonic()
        with pytest.raises(gs.QueueTimeout, match="Nothing was leased"):
            waits()
        assert 0.9 < time.monotonic() - started < 10
        assert 1.0 <= waits.last_run.queued_s < 10  # its receipt counts the wait it gave up on
        assert [l["state"] for l in _open_leases(broker, admin)] == ["placed"]  # only the holder's lease
