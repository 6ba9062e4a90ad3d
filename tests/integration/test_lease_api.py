"""`gs.lease` (several runs on one lease), `gs.status`, local modules, GPU visibility."""
from __future__ import annotations

import importlib
import sys
import textwrap
import threading
import time

import pytest
import ray

import gpusession as gs

from ..conftest import CLUSTER_GPUS, free_gpus, take_back_from_a_stuck_caller, wait_for
from ..machine import cluster_line


def test_one_lease_serves_several_runs_and_is_released_when_the_block_ends(cluster, quiet):
    def rank_and_lease():
        return gs.context().rank, gs.context().lease_id

    with gs.lease(gpus=2) as lease:
        # Ray's cluster view (ray.available_resources) follows the raylets' reports, so it can
        # still show the GPUs free just after the lease's placement group was placed (CI, loaded)
        wait_for(lambda: free_gpus() == CLUSTER_GPUS - 2, timeout=10, message="Ray showing the lease's 2 GPUs taken")
        first = lease.run(rank_and_lease)
        second = lease.run(rank_and_lease)
        status = gs.status()
        assert [l["lease_id"] for l in status.leases] == [lease.lease_id]
        assert status.cluster["gpus_leased"] == 2
    assert first == second == (0, lease.lease_id)
    assert free_gpus() == CLUSTER_GPUS


def test_status_shows_capacity_whether_gpus_are_logical_and_the_callers_quota(cluster):
    status = gs.status()
    assert status.cluster["gpus_total"] == CLUSTER_GPUS and status.cluster["logical_gpus"] is cluster.logical
    assert status.quota["gpus_in_use"] == 0 and status.quota["max_priority"] == "normal"
    assert cluster_line(CLUSTER_GPUS, logical=cluster.logical) in str(status)


def test_each_worker_sees_only_its_leases_gpus_like_torchrun(cluster, quiet):
    def visible():
        import os

        ctx = gs.context()
        return os.environ["CUDA_VISIBLE_DEVICES"], ctx.gpu_ids, os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]

    with gs.lease(gpus=2) as lease:
        seen = lease.run(visible)
    node_gpus = seen[0].split(",")
    assert len(node_gpus) == 2 and seen[1][0] in node_gpus and seen[2:] == ("0", "2")
    slots = sorted(gpu for slot in lease.slots for gpu in slot.gpu_ids)
    assert sorted(node_gpus) == slots  # exactly the lease's GPUs, no other lease's


def test_a_module_written_next_to_the_caller_reaches_the_workers_with_its_current_code(cluster, quiet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mymodel.py").write_text("def answer():\n    return 41\n")
    import mymodel

    @gs.distributed(gpus=2, return_all=True)
    def use_local_module():
        return mymodel.answer()

    try:
        assert use_local_module() == [41, 41]
        (tmp_path / "mymodel.py").write_text(textwrap.dedent("""
            def answer():
                return 42
        """))
        importlib.reload(mymodel)  # what a user does after editing; warm workers must not keep 41
        assert use_local_module() == [42, 42]
    finally:
        sys.modules.pop("mymodel", None)


def test_a_lease_revoked_between_runs_raises_on_the_next_run(cluster, quiet, broker, admin):
    from gpusession.broker import client

    lease = gs.lease(gpus=1)
    client.call(broker.revoke, lease.lease_id, admin)
    with pytest.raises(gs.LeaseRevoked, match="revoked by admin"):
        lease.notice(wait=True)
        lease.run(lambda: None)
    assert free_gpus() == CLUSTER_GPUS


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def _probe_that_never_answers() -> None:
    time.sleep(600)


def test_a_grant_revoked_while_it_is_being_placed_raises_the_brokers_reason(cluster, quiet, broker, admin,
                                                                           monkeypatch):
    """A busy caller can take longer to place its group than the broker's grace; the group then
    vanishes under it. The caller must see why (not a raw Ray error), and nothing stays held."""
    from gpusession.broker import client

    from gpusession.run.caller.pool import WorkerPool

    monkeypatch.setattr(importlib.import_module("gpusession.run.caller.bundles"), "_probe", _probe_that_never_answers)
    monkeypatch.setattr(WorkerPool, "probe_bundles", lambda self, *args: None)  # no node host probes either
    outcome: dict = {}

    def acquire() -> None:
        try:
            outcome["lease"] = gs.lease(gpus=2)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    caller = threading.Thread(target=acquire)
    caller.start()
    try:
        deadline = time.monotonic() + 60
        while free_gpus() != CLUSTER_GPUS - 2:  # the caller's group is placed: its probes are running
            assert time.monotonic() < deadline, "the grant was never placed"
            time.sleep(0.05)
        # Its row may read "granted" or already "placed": the broker marks a grant placed once Ray
        # created its group, whether or not the caller has finished probing it (CI saw "placed").
        [held] = [l for l in client.call(broker.leases, admin) if l["state"] in ("granted", "placed")]
        client.call(broker.revoke, held["lease_id"], admin)
        caller.join(60)
    finally:  # a failed step above must not leave the caller holding 2 GPUs for the next tests
        take_back_from_a_stuck_caller(caller, broker, admin)
    assert isinstance(outcome.get("error"), gs.LeaseRevoked), outcome
    assert "revoked by admin" in str(outcome["error"])
    freed_by = time.monotonic() + 5.0  # the broker removed the group: Ray's view follows within moments
    while free_gpus() != CLUSTER_GPUS and time.monotonic() < freed_by:
        time.sleep(0.02)
    assert free_gpus() == CLUSTER_GPUS


def test_the_next_call_runs_in_a_fresh_process_from_the_same_warm_parent(cluster, quiet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "helper_by_name.py").write_text("VALUE = 1\n")

    @gs.distributed(gpus=1)
    def imports_by_name_and_sets_env():
        import os

        import helper_by_name  # imported on the worker from the caller's directory, by name

        seen = os.environ.get("LEFT_BY_LAST_CALL")
        os.environ["LEFT_BY_LAST_CALL"] = "yes"
        return helper_by_name.VALUE, seen, (os.getpid(), os.getppid())

    value, seen, (pid, parent) = imports_by_name_and_sets_env()
    assert (value, seen) == (1, None)
    (tmp_path / "helper_by_name.py").write_text("VALUE = 2\n")
    value, seen, (next_pid, same_parent) = imports_by_name_and_sets_env()
    assert next_pid != pid and same_parent == parent  # a fresh process from the same warm parent
    assert (value, seen) == (2, None)  # fresh code, and no variable left behind


def test_running_on_a_released_lease_says_so(cluster, quiet):
    with gs.lease(gpus=1) as lease:
        pass
    with pytest.raises(gs.GPUSessionError, match="already released; get GPUs again with gs.lease"):
        lease.run(lambda: None)
