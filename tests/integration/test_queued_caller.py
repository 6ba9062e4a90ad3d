"""A queued request is judged by its caller's Ray job first, its polls second: a running caller
keeps its place through a silence longer than the queue heartbeat (its poll can come seconds late
on a loaded machine), a caller Ray does not list as running is dropped after the heartbeat."""
from __future__ import annotations

import time
import uuid

import ray

import gpusession as gs
from gpusession.broker import client
from gpusession.broker.service.service import TICK_S
from gpusession.identity import current_user

from ..conftest import CLUSTER_GPUS, wait_for

HEARTBEAT_S = 3.0  # the session broker's heartbeat_timeout_s (tests/conftest.py)


def _request(job_id: str) -> dict:
    spec = {"request_id": uuid.uuid4().hex, "user": current_user(), "job_id": job_id, "workers": 1,
            "gpus_per_worker": 1.0}
    return spec


def _state(broker, admin, lease_id: int) -> dict:
    return next(row for row in client.call(broker.leases, admin, True) if row["lease_id"] == lease_id)


def test_a_queued_request_of_a_running_caller_keeps_its_place_through_a_silence_longer_than_the_heartbeat(
        cluster, quiet, broker, admin):
    held = gs.lease(gpus=CLUSTER_GPUS)  # every GPU: the next request queues
    lease_id = None
    try:
        view = client.call(broker.request, _request(ray.get_runtime_context().get_job_id()))
        lease_id = view["lease_id"]
        assert view["state"] == "queued", view
        heard_at = time.monotonic()
        silence_s = HEARTBEAT_S + 4 * TICK_S  # past the heartbeat and two more reconciliations
        time.sleep(silence_s)  # this caller does not poll: the silence is what is tested
        row = _state(broker, admin, lease_id)
        assert row["state"] == "queued", (
            f"dropped after {time.monotonic() - heard_at:.1f} s without a poll although its Ray job runs: {row}")
    finally:
        if lease_id is not None:
            client.call(broker.revoke, lease_id, admin)
        held.release()


def test_a_queued_request_whose_job_ray_does_not_list_as_running_is_dropped_after_the_heartbeat(
        cluster, quiet, broker, admin):
    held = gs.lease(gpus=CLUSTER_GPUS)
    lease_id = None
    try:
        unknown_job = "7f" + ray.get_runtime_context().get_job_id()[2:]  # Ray's form, a job that never ran
        view = client.call(broker.request, _request(unknown_job))
        heard_at = time.monotonic()
        lease_id = view["lease_id"]
        bound_s = HEARTBEAT_S + 2 * TICK_S + 2.0  # the heartbeat, a tick to see it, margin for a loaded machine
        wait_for(lambda: _state(broker, admin, lease_id)["state"] == "ended", timeout=bound_s,
                 message=f"the silent request of an unknown job closed within {bound_s:g} s of its last poll")
        took = time.monotonic() - heard_at
        row = _state(broker, admin, lease_id)
        assert row["end_reason"] == "caller gone", row
        assert took >= HEARTBEAT_S - TICK_S, f"closed after {took:.1f} s: before its {HEARTBEAT_S:g} s heartbeat"
    finally:
        if lease_id is not None and _state(broker, admin, lease_id)["state"] != "ended":
            client.call(broker.revoke, lease_id, admin)
        held.release()
