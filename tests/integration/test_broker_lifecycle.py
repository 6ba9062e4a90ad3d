"""The broker across its own life: restarts, replacement by a newer client, foreign GPU use,
and who may do what."""
from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

import gpusession as gs
from gpusession.broker import client
from gpusession.broker.service.settings import BrokerConfig
from gpusession.errors import NotAuthorized
from gpusession.identity import current_user

from ..conftest import CLUSTER_GPUS, free_gpus, process_running, take_back_from_a_stuck_caller, wait_for

HOLDS_ONE_GPU = """
import time
import gpusession as gs
lease = gs.lease(gpus=1)
print("HOLDING", lease.lease_id, flush=True)
time.sleep(600)
"""


def _row(broker, admin, lease_id: int) -> dict:
    return next(l for l in client.call(broker.leases, admin, True) if l["lease_id"] == lease_id)


def test_a_restarted_broker_keeps_live_leases_and_closes_one_whose_caller_died_meanwhile(cluster, quiet, driver, broker, admin):
    mine = gs.lease(gpus=1)
    try:
        other = driver(HOLDS_ONE_GPU)
        theirs = int(other.wait_for_line("HOLDING").split()[-1])
        pid = client.call(broker.info)["pid"]
        ray.kill(broker, no_restart=False)  # crash: Ray restarts it from the same ledger...
        died_at = time.time()
        other.kill()  # ...while another user's kernel dies
        wait_for(lambda: client.call(broker.info)["pid"] != pid, timeout=60, message="the broker restarted")
        wait_for(lambda: _row(broker, admin, theirs)["state"] == "ended", timeout=10,
                 message="the dead caller's lease closed after the restart")
        closed = _row(broker, admin, theirs)
        assert closed["end_reason"] == "caller gone"
        assert abs(closed["released_at"] - died_at) < 2.0  # its real end (the job's), not the restart time
        assert _row(broker, admin, mine.lease_id)["state"] == "placed"  # a live lease survives the restart
    finally:  # on every path: a lease left placed would starve every later test
        mine.release()
    assert free_gpus() == CLUSTER_GPUS


@gs.distributed(gpus=1)
def leave_a_row():
    return gs.context().lease_id


def a_finished_lease_then_an_older_broker(cluster, broker) -> tuple[int, object]:
    """A call's lease ends "finished" in the ledger; then the broker is killed for good and one
    that says it runs gpusession 0.0.1 is started on the same ledger. Returns (lease id, handle)."""
    old_lease = leave_a_row()
    ray.kill(broker, no_restart=True)
    client._wait_until_gone()
    return old_lease, client._create(BrokerConfig(db_path=str(cluster.db_path), version_override="0.0.1"))


def test_a_newer_client_replaces_an_older_broker_and_keeps_its_ledger(cluster, quiet, broker, admin):
    old_lease, stale = a_finished_lease_then_an_older_broker(cluster, broker)
    assert client.call(stale.version) == "0.0.1"

    client.forget()
    fresh = client.broker()  # what any newer kernel does on its first call
    assert client.call(fresh.version) == gs.__version__
    assert _row(fresh, admin, old_lease)["end_reason"] == "finished"  # the ledger came along
    assert client.call(fresh.info)["policy"]["preemption_grace_s"] == 3.0  # and its settings
    assert leave_a_row() != old_lease  # and it schedules


def test_gpus_used_outside_gpusession_are_counted_and_never_handed_out_twice(cluster, quiet, broker):
    foreign = placement_group([{"GPU": 1}, {"GPU": 1}])  # someone using Ray directly
    ray.get(foreign.ready())
    try:
        wait_for(lambda: client.call(broker.cluster)["gpus_unmanaged"] == 2, timeout=5,
                 message="the broker counting 2 GPUs used outside gpusession")
        with pytest.raises(gs.QueueTimeout, match="waiting for capacity"):
            gs.distributed(gpus=3, queue_timeout=2)(lambda: None)()
    finally:
        remove_placement_group(foreign)
    wait_for(lambda: client.call(broker.cluster)["gpus_unmanaged"] == 0, timeout=5,
             message="the foreign GPUs no longer counted")
    assert gs.distributed(gpus=3, return_all=True)(lambda: gs.context().rank)() == [0, 1, 2]


def test_admin_operations_need_the_token_and_owners_may_revoke_only_their_own(cluster, quiet, broker, admin):
    user = {"user": "mallory"}
    with pytest.raises(NotAuthorized, match="admin token"):
        client.call(broker.set_quota, "mallory", {"max_gpus": 100}, user)
    with pytest.raises(NotAuthorized, match="admin token"):
        client.call(broker.signing_key, user)
    with pytest.raises(NotAuthorized, match="admin token"):
        client.call(broker.set_quota, "mallory", {"max_gpus": 100}, {"user": "mallory", "token": "guess"})
    held = gs.lease(gpus=1)
    try:
        with pytest.raises(NotAuthorized, match="only its owner or an admin"):
            client.call(broker.revoke, held.lease_id, user)
        assert [l["user"] for l in client.call(broker.leases, user)] == []  # users see only their own
        assert client.call(broker.quota, "mallory", user)["user"] == "mallory"
        with pytest.raises(NotAuthorized, match="Only an admin may read the quota"):
            client.call(broker.quota, current_user(), user)  # someone else's quota
    finally:
        held.release()


def test_a_run_in_flight_survives_its_broker_being_replaced_by_another_client(cluster, quiet, broker, admin, tmp_path):
    import threading

    gate = tmp_path / "gate"

    @gs.distributed(gpus=2)
    def waits_for_gate(path):
        import os
        import time as t

        while not os.path.exists(path):
            t.sleep(0.02)
        return gs.context().lease_id

    result: dict = {}
    caller = threading.Thread(target=lambda: result.setdefault("lease", waits_for_gate(str(gate))))
    caller.start()
    try:
        wait_for(lambda: any(l["state"] == "placed" for l in client.call(broker.leases, admin)), timeout=60,
                 message="the run placed")
        # Another (newer) client replaces the broker; this process still holds the old handle.
        ray.kill(broker, no_restart=True)
        client._wait_until_gone()
        replacement = client._create(BrokerConfig(db_path=str(cluster.db_path)))
    finally:  # on every path: a run left waiting on the gate would hold 2 GPUs for later tests
        gate.touch()
        caller.join(120)
    assert "lease" in result  # the run finished normally, no ActorDiedError
    assert _row(replacement, admin, result["lease"])["end_reason"] == "finished"
    assert gs.distributed(gpus=1)(lambda: "still works")() == "still works"


def test_a_worker_stops_by_itself_when_its_leases_group_is_taken_back(cluster, quiet, broker, admin, tmp_path):
    import os
    import threading

    pid_file = tmp_path / "pid"

    @gs.distributed(gpus=1)
    def computes_forever(path):
        import time as t

        open(path, "w").write(str(os.getpid()))
        while True:
            t.sleep(0.05)

    outcome: dict = {}

    def call() -> None:
        try:
            computes_forever(str(pid_file))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, message="the worker running")
        worker_pid = int(pid_file.read_text())
        lease = next(l for l in client.call(broker.leases, admin) if l["state"] == "placed")
        group = next(pg for pg in ray.util.placement_group_table().values() if pg["name"] == lease["pg_name"])
        taken_at = time.monotonic()
        from gpusession.broker.service.rayview import remove_group

        remove_group(group["placement_group_id"])  # what the broker does when it forces a lease off
        wait_for(lambda: not process_running(worker_pid),
                 timeout=10, message="the worker process gone")
        assert time.monotonic() - taken_at < 5  # WATCHDOG_POLL_S is 1 s
        caller.join(60)
    finally:  # a step above failed: the run computes forever, so take its lease back for later tests
        take_back_from_a_stuck_caller(caller, broker, admin)
    assert isinstance(outcome.get("error"), gs.WorkerFailed)
    assert free_gpus() == CLUSTER_GPUS


def test_an_older_broker_started_by_another_client_while_a_newer_one_replaces_it_is_replaced_too(
        cluster, quiet, broker, admin, monkeypatch):
    """An admin's newer client kills the older broker; before it starts its own, another kernel of
    the older gpusession, whose call found the broker gone, starts one of its own code (played
    here in the moment between the two). The newer client checks again and replaces that one
    too: the broker answering is this client's version, on the same ledger. Before, it kept the
    one it found under the name, older code and all, believing it had replaced it."""
    old_lease, _ = a_finished_lease_then_an_older_broker(cluster, broker)
    wait_until_gone, raced = client._wait_until_gone, []

    def and_an_older_client_starts_one(*args, **kwargs):
        wait_until_gone(*args, **kwargs)
        if not raced:  # once: the older client's broker, its settings from the recorded ledger
            raced.append(client._create(BrokerConfig(version_override="0.0.2")))

    monkeypatch.setattr(client, "_wait_until_gone", and_an_older_client_starts_one)
    client.forget()
    fresh = client.broker()
    assert raced, "the older client's broker was never started in between"
    assert client.call(fresh.version) == gs.__version__
    assert client.call(fresh.info, admin)["db_path"] == str(cluster.db_path)
    assert _row(fresh, admin, old_lease)["end_reason"] == "finished"
