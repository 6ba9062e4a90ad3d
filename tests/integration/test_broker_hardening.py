"""The findings of issue 10, each as the exact call that used to succeed: another process (another
user, or the same user's other kernel) reaching for someone's lease, nonsense requests, a
caller's clock, a broker replaced without the admin token, and a usage query that blocked
everyone. Each is refused quickly and leaves the ledger and Ray's view as they were."""
from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid

import pytest
import ray

import gpusession as gs
from gpusession.broker import client
from gpusession.broker.storage.secrets import admin_token_path
from gpusession.broker.service.settings import BrokerConfig
from gpusession.errors import InvalidRequest
from gpusession.identity import current_user

from ..conftest import CLUSTER_GPUS, free_gpus

REACH_FOR_A_LEASE = """
import json, os, time
from gpusession.broker import client
broker = client.broker()
client.call(broker.cluster)  # connected and warm before the clock starts
lease_id, node_workers = int(os.environ["VICTIM"]), json.loads(os.environ["NODE_WORKERS"])
auth = client.lease_auth()
attempts = {
    "wait": lambda: client.call(broker.wait, lease_id, -1, 0.0, auth=auth),
    "watch": lambda: client.call(broker.watch, lease_id, auth=auth, timeout=5),
    "placed": lambda: client.call(broker.placed, lease_id, node_workers, auth=auth),
    "release": lambda: client.call(broker.release, lease_id, "finished", auth=auth),
    "relocate": lambda: client.call(broker.relocate, lease_id, list(node_workers), auth=auth),
    "relocated": lambda: client.call(broker.relocated, lease_id, node_workers, gpu_ids={}, auth=auth),
    "release with a time": lambda: client.call(broker.release, lease_id, "finished", 0.0),
    "release with no credentials": lambda: client.call(broker.release, lease_id, "finished", auth={}),
}
out = {}
for name, attempt in attempts.items():
    started = time.perf_counter()
    try:
        attempt()
        out[name] = ["accepted", 0.0, ""]
    except Exception as exc:
        out[name] = [type(exc).__name__, time.perf_counter() - started, str(exc)]
print("RESULT " + json.dumps(out), flush=True)
"""


def _everything(broker, admin) -> list[dict]:
    """Every lease as an admin sees it, minus the one figure that moves by itself (age_s)."""
    views = client.call(broker.leases, admin, True, 10_000)
    return sorted(({k: v for k, v in view.items() if k != "age_s"} for view in views), key=lambda v: v["lease_id"])


def _group_state(pg_name: str) -> str | None:
    return next((pg["state"] for pg in ray.util.placement_group_table().values() if pg["name"] == pg_name), None)


@pytest.mark.parametrize("intruder", ["mallory", "the same user in another kernel"])
def test_another_process_cannot_wait_watch_place_or_release_someone_elses_lease(cluster, quiet, driver, broker,
                                                                               admin, intruder):
    held = gs.lease(gpus=1)
    try:
        before = _everything(broker, admin)
        mine = next(v for v in before if v["lease_id"] == held.lease_id)
        user = "mallory" if intruder == "mallory" else current_user()
        other = driver(REACH_FOR_A_LEASE, GPUSESSION_USER=user, VICTIM=str(held.lease_id),
                       NODE_WORKERS=json.dumps(mine["node_workers"]))
        results = json.loads(other.wait_for_line("RESULT", timeout=120)[len("RESULT "):])
        for name, (kind, seconds, message) in results.items():
            assert kind in ("NotAuthorized", "TypeError"), (name, kind, message)
            assert seconds < 1.0, (name, seconds)  # milliseconds on an idle machine
        assert "belongs to" in results["release"][2] and "Nothing was changed" in results["release"][2]
        assert _everything(broker, admin) == before
        assert _group_state(mine["pg_name"]) == "CREATED" and free_gpus() == CLUSTER_GPUS - 1
        assert held.run(lambda: "still mine") == "still mine"  # her run goes on
    finally:
        held.release()


def _spec(**changes) -> dict:
    spec = {"request_id": uuid.uuid4().hex, "user": current_user(), "job_id": ray.get_runtime_context().get_job_id(),
            "workers": 1, "gpus_per_worker": 1.0}
    spec.update(changes)
    return spec


NONSENSE = [("workers", 0), ("workers", -3), ("workers", 2.5), ("gpus_per_worker", 0), ("gpus_per_worker", -1),
            ("gpus_per_worker", 1e-320), ("gpus_per_worker", math.nan), ("gpus_per_worker", math.inf),
            ("gpus_per_worker", 5), ("gpus_per_worker", 1e-9), ("max_hold_s", math.nan), ("queue_timeout_s", -1),
            ("min_workers", 5), ("placement", "everywhere"), ("priority", 7), ("released_at", 0)]


def test_nonsense_requests_are_refused_within_a_second_and_write_nothing(cluster, quiet, broker, admin):
    before = _everything(broker, admin)
    for field, value in NONSENSE:
        started = time.perf_counter()
        with pytest.raises(InvalidRequest, match=field):
            client.call(broker.request, _spec(**{field: value}, placement="spread") if field == "workers"
                        else _spec(**{field: value}))
        took = time.perf_counter() - started
        assert took < 1.0, f"{field} refused after {took:.3f} s: bound 1 s (a Ray actor call on a loaded machine)"
    assert _everything(broker, admin) == before
    started = time.perf_counter()
    with pytest.raises(InvalidRequest, match="gpus_per_worker"):
        gs.distributed(gpus=1, gpus_per_worker=2**-30, placement="spread")(lambda: None)()
    took = time.perf_counter() - started
    assert took < 2.0, f"refused after {took:.3f} s: bound 2 s (connect and one broker call, loaded machine)"
    assert _everything(broker, admin) == before and free_gpus() == CLUSTER_GPUS


def test_the_owner_cannot_report_a_placement_that_is_not_its_grant(cluster, quiet, broker, admin):
    held = gs.lease(gpus=2)
    try:
        before = _everything(broker, admin)
        node = next(iter(next(v for v in before if v["lease_id"] == held.lease_id)["node_workers"]))
        for wrong in ({node: -3}, {node: 3}, {node: 1}, {"ab" * 28: 2}, {node: 2.0}):
            started = time.perf_counter()
            with pytest.raises(InvalidRequest, match="node_workers"):
                client.call(broker.placed, held.lease_id, wrong, auth=client.lease_auth())
            assert time.perf_counter() - started < 1.0
        assert _everything(broker, admin) == before
    finally:
        held.release()


def test_a_lease_may_give_workers_back_unasked_but_never_below_min_gpus_nor_grow_without_an_offer(
        cluster, quiet, broker, admin):
    """resize without a notice: an elastic lease that lost a host shrinks by itself; nothing else."""
    elastic, fixed = gs.lease(gpus=3, min_gpus=2), gs.lease(gpus=1)
    try:
        before = _everything(broker, admin)
        node = next(iter(next(v for v in before if v["lease_id"] == elastic.lease_id)["node_workers"]))
        auth = client.lease_auth()
        for lease_id, workers, node_workers, match in (
                (elastic.lease_id, 4, {node: 4}, "workers"),  # more than it asked for
                (elastic.lease_id, 1, {node: 1}, "workers"),  # below min_gpus
                (elastic.lease_id, 3, None, "no offer to grow"),  # "take" GPUs nobody offered
                (elastic.lease_id, 2, None, "no offer to grow"),  # a shrink must say where it is
                (fixed.lease_id, 0, {node: 0}, "workers")):  # not elastic: no smaller size exists
            with pytest.raises(InvalidRequest, match=match):
                client.call(broker.resize, lease_id, workers, node_workers, auth=auth)
        assert _everything(broker, admin) == before
    finally:
        elastic.release()
        fixed.release()


def test_a_lease_moves_off_a_lost_host_only_where_the_broker_puts_it_and_a_refusal_changes_nothing(
        cluster, quiet, broker, admin):
    """relocate (a run lost a host: move its workers to free GPUs elsewhere) and relocated (the
    re-made group is there, on these GPU ids). One node here: no move can be made, every check can."""
    held, other = gs.lease(gpus=2), gs.lease(gpus=1)
    try:
        before = _everything(broker, admin)
        (node, ids), = next(v for v in before if v["lease_id"] == held.lease_id)["gpu_ids"].items()
        taken = next(v for v in before if v["lease_id"] == other.lease_id)["gpu_ids"][node][0][0]
        auth = client.lease_auth()
        for lost, match in (([], "lost_nodes"), (node, "lost_nodes"), ([node, node], "lost_nodes"),
                            ([7], "lost_nodes"), (["ab" * 28], "where lease .* has no workers")):
            with pytest.raises(InvalidRequest, match=match):
                client.call(broker.relocate, held.lease_id, lost, auth=auth)
        answer = client.call(broker.relocate, held.lease_id, [node], auth=auth)  # its only node lost
        assert answer["moved"] is False
        assert answer["why"] == "the hosts that remain have 0 GPUs in all, fewer than the 2 the run needs"
        for node_workers, gpu_ids, match in (
                ({node: 1}, {node: [ids[0]]}, "node_workers"),  # fewer workers than the lease has
                ({"ab" * 28: 2}, {"ab" * 28: ids}, "not where lease"),  # not where the broker moved it
                ({node: 2}, {node: [ids[0], ids[0]]}, "more than once"),  # both workers on one GPU
                ({node: 2}, {node: [[taken], ids[1]]}, f"lease {other.lease_id} holds it"),
                ({node: 2}, {node: [["0", "1"], ids[1]]}, "gpu_ids")):  # 2 ids for a 1-GPU worker
            with pytest.raises(InvalidRequest, match=match) as refused:
                client.call(broker.relocated, held.lease_id, node_workers, gpu_ids=gpu_ids, auth=auth)
            assert "Nothing was changed" in str(refused.value)
        assert _everything(broker, admin) == before
        assert client.call(broker.cluster)["gpus_lost"] == 0  # a move refused marks no node lost
        view = client.call(broker.relocated, held.lease_id, {node: 2}, gpu_ids={node: ids}, auth=auth)
        assert view["node_workers"] == {node: 2} and view["gpu_ids"] == {node: ids}
        client.call(broker.revoke, other.lease_id, admin)
        noticed = _everything(broker, admin)
        with pytest.raises(InvalidRequest, match="under a revoke notice: it cannot move"):
            client.call(broker.relocate, other.lease_id, [node], auth=auth)
        assert _everything(broker, admin) == noticed
    finally:
        other.release()
        held.release()


def test_the_owner_cannot_report_gpu_ids_that_are_not_its_grant(cluster, quiet, broker, admin):
    held, other = gs.lease(gpus=2), gs.lease(gpus=1)
    try:
        before = _everything(broker, admin)
        mine = next(v for v in before if v["lease_id"] == held.lease_id)
        theirs = next(v for v in before if v["lease_id"] == other.lease_id)
        (node, ids), = mine["gpu_ids"].items()  # what the client reported: Ray's ids of each bundle
        taken = theirs["gpu_ids"][node][0][0]
        assert mine["node_workers"] == {node: 2} and sorted(len(w) for w in ids) == [1, 1]
        assert len({w[0] for w in ids} | {taken}) == 3 and {w[0] for w in ids} | {taken} <= {"0", "1", "2", "3"}
        wrong = [
            ({node: [["0", "1"], ["2"]]}, "a worker with 2 ids where each needs 1"),
            ({node: [[ids[0][0]]]}, "one worker missing"),
            ({node: [ids[0], ids[0]]}, "both workers on one GPU"),
            ({node: [[taken], ids[1]]}, "another lease's GPU"),
            ({node: [[0], ids[1]]}, "an id that is not a string"),
            ({node: ids, "ab" * 28: [["0"]]}, "a node the lease is not on"),
        ]
        for gpu_ids, why in wrong:
            started = time.perf_counter()
            with pytest.raises(InvalidRequest, match="gpu_ids") as refused:
                client.call(broker.placed, held.lease_id, {node: 2}, gpu_ids=gpu_ids, auth=client.lease_auth())
            assert time.perf_counter() - started < 1.0, why
            assert "Nothing was changed" in str(refused.value), why
        with pytest.raises(InvalidRequest, match=f"lease {other.lease_id} holds it"):
            client.call(broker.placed, held.lease_id, {node: 2}, gpu_ids={node: [[taken], ids[1]]},
                        auth=client.lease_auth())
        with pytest.raises(InvalidRequest, match="gpu_ids must come with node_workers"):
            client.call(broker.placed, held.lease_id, {}, gpu_ids={node: ids}, auth=client.lease_auth())
        assert _everything(broker, admin) == before
    finally:
        other.release()
        held.release()


def test_gpu_ids_of_a_lease_ray_no_longer_places_do_not_block_the_lease_ray_gave_them_to(cluster, quiet, broker,
                                                                                       admin):
    """Ray, not the books, decides which GPU a bundle gets: a group removed before its release
    reaches the broker (or before a restarted broker reconciles it) frees GPUs Ray may hand on at
    once. The lease Ray gave them to is not refused; the stale record is dropped."""
    gone, newcomer = gs.lease(gpus=1), gs.lease(gpus=1)
    try:
        views = {v["lease_id"]: v for v in _everything(broker, admin)}
        (node, [[stale_id]]), = views[gone.lease_id]["gpu_ids"].items()
        ray.util.remove_placement_group(gone._pg)  # its caller removed the group; the release is on its way
        deadline = time.monotonic() + 30
        while ray.util.placement_group_table(gone._pg).get("state") != "REMOVED":
            assert time.monotonic() < deadline, "Ray never removed the group"
            time.sleep(0.05)
        view = client.call(broker.placed, newcomer.lease_id, {node: 1}, gpu_ids={node: [[stale_id]]},
                           auth=client.lease_auth())
        assert view["gpu_ids"] == {node: [[stale_id]]}
        after = {v["lease_id"]: v for v in _everything(broker, admin)}
        assert not after[gone.lease_id]["gpu_ids"] and after[gone.lease_id]["state"] != "ended"
    finally:
        newcomer.release()
        gone.release()


def test_gpu_ids_beyond_what_a_node_has_are_refused(cluster, quiet, broker, admin):
    shared, other = gs.lease(gpus=2, gpus_per_worker=0.5), gs.lease(gpus=2)
    try:
        before = _everything(broker, admin)
        (node, ids), = next(v for v in before if v["lease_id"] == shared.lease_id)["gpu_ids"].items()
        assert len(ids) == 4 and len({w[0] for w in ids}) <= 2  # four half-GPU workers on at most two GPUs
        made_up = [["5"], ["6"], ["7"], ["8"]]  # with the other lease's 2 GPUs: 6 GPUs on a 4-GPU node
        with pytest.raises(InvalidRequest, match="has 4: some of them do not exist there"):
            client.call(broker.placed, shared.lease_id, {node: 4}, gpu_ids={node: made_up},
                        auth=client.lease_auth())
        assert _everything(broker, admin) == before
    finally:
        other.release()
        shared.release()


def test_gpu_seconds_are_counted_by_the_brokers_clock_not_the_callers(cluster, quiet, broker, admin):
    held = gs.lease(gpus=2)
    auth = client.lease_auth()
    with pytest.raises(TypeError):  # the old call shape with a caller's time is refused
        client.call(broker.release, held.lease_id, "finished", 0.0)
    time.sleep(0.3)
    held.release()
    released = time.time()
    row = next(v for v in _everything(broker, admin) if v["lease_id"] == held.lease_id)
    assert row["end_reason"] == "finished" and abs(row["released_at"] - released) < 1.0
    assert row["gpu_seconds"] == pytest.approx(2 * (row["released_at"] - row["granted_at"]))
    assert row["gpu_seconds"] >= 2 * 0.3
    assert client.call(broker.release, held.lease_id, "finished", auth=auth)["gpu_seconds"] == row["gpu_seconds"]


ASK_FOR_THE_BROKER = """
from gpusession.broker import client
try:
    handle = client.broker()
    print("USING", client.call(handle.version), client.call(handle.info)["pid"], flush=True)
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
"""


@contextlib.contextmanager
def token_hidden(db_path):
    """The admin token file beside the ledger renamed away, and back on every path."""
    token = admin_token_path(db_path)
    hidden = token.with_name(token.name + ".hidden-by-test")
    token.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(token)


def test_a_newer_client_without_the_admin_token_cannot_replace_the_broker(cluster, quiet, driver, broker, admin,
                                                                          tmp_path):
    info = client.call(broker.info)
    assert "db_path" not in info and cluster.admin_token not in json.dumps(info)
    assert client.call(broker.info, admin)["db_path"] == str(cluster.db_path)  # an admin may know
    try:
        for protocol, expected in ((None, "USING 0.0.1"), (1, "REFUSED BrokerOutdated")):
            ray.kill(broker, no_restart=True)
            client._wait_until_gone()
            stale = client._create(BrokerConfig(db_path=str(cluster.db_path), version_override="0.0.1",
                                                protocol_override=protocol))
            pid = client.call(stale.info)["pid"]
            # A kernel of a newer gpusession with no token: none in its home or environment, and the
            # file beside the ledger unreadable to it. A client finds that file through the cluster's
            # record of its ledger, and root reads any file, so the test hides it while the kernel
            # looks (the broker read its token when it started).
            with token_hidden(cluster.db_path):
                line = driver(ASK_FOR_THE_BROKER, GPUSESSION_HOME=str(tmp_path)).wait_for_line(
                    expected.split()[0], 120)
            assert line.startswith(expected), line
            if protocol is None:
                assert line.split()[-1] == str(pid)  # the same broker, not a replacement
            else:
                assert "Only an admin can upgrade" in line and "admin_token" in line
            assert client.call(stale.info)["pid"] == pid and client.call(stale.version) == "0.0.1"
            broker = stale
    finally:
        client.forget()
        fresh = client.broker()  # this process holds the token (beside the ledger): it upgrades
        assert client.call(fresh.version) == gs.__version__


def test_a_ten_year_usage_query_does_not_hold_up_anyone_else(cluster, quiet, broker, admin):
    held = gs.lease(gpus=1)  # an open lease: the old broker walked every day up to 9999 for it
    try:
        outcome: dict = {}

        def report() -> None:
            started = time.perf_counter()
            outcome["rows"] = client.call(broker.usage, admin, 0.0, 253402300799.0, "day")
            outcome["seconds"] = time.perf_counter() - started

        reader = threading.Thread(target=report)
        reader.start()
        trips = []
        for _ in range(20):
            started = time.perf_counter()
            view = client.call(broker.request, _spec(gpus_per_worker=0.5))
            client.call(broker.release, view["lease_id"], "finished", auth=client.lease_auth())
            trips.append(time.perf_counter() - started)
        reader.join(60)
        assert outcome["seconds"] < 5.0  # it was 10.4 s
        assert max(trips) < 1.0  # it waited 10.2 s behind the report
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert any(r["day"] == today for r in outcome["rows"]) and all(r["day"] <= today for r in outcome["rows"])
    finally:
        held.release()
