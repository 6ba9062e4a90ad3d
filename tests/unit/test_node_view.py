"""What JupyterLab's sidebar shows per node: the GPUs leased there, the part lent beyond quotas,
what is free, and a lost node's GPUs as lost (never free)."""
from __future__ import annotations

from gpusession.broker.policy.model import ActiveLease, NodeCapacity, Priority
from gpusession.broker.service.rayview import Snapshot
from gpusession.broker.service.views import node_view


def lease(lease_id: int, nodes: dict | None, *, over_quota: bool = False, gpus_per_worker: float = 1.0) -> ActiveLease:
    workers = sum((nodes or {"x": 1}).values())
    return ActiveLease(lease_id, "alice", workers, gpus_per_worker, Priority.NORMAL, over_quota, 0.0,
                       node_workers=nodes)


def test_each_node_shows_its_own_leased_lent_and_free_gpus():
    snapshot = Snapshot([NodeCapacity("a", 4.0, 0.5), NodeCapacity("b", 4.0)], logical=True)
    active = [lease(1, {"a": 2}), lease(2, {"a": 1, "b": 1}, over_quota=True), lease(3, None)]
    a, b = (node_view(node, snapshot, active) for node in snapshot.nodes)
    assert (a["leased"], a["lent"], a["unmanaged"], a["free"]) == (3.0, 1.0, 0.5, 0.5)
    assert (b["leased"], b["lent"], b["free"], b["lost"]) == (1.0, 1.0, 3.0, False)


def test_a_lost_node_has_no_free_gpus_and_names_its_address():
    snapshot = Snapshot([NodeCapacity("a", 2.0, 2.0)], logical=True, lost={"a": "10.0.0.7"})
    view = node_view(snapshot.nodes[0], snapshot, [])
    assert (view["lost"], view["free"], view["unmanaged"], view["address"]) == (True, 0.0, 0.0, "10.0.0.7")


def test_gpusession_status_prints_each_node_and_each_runs_step_and_notebook_as_the_sidebar_does():
    from gpusession.api.status import Status

    snapshot = Snapshot([NodeCapacity("a1b2c3d4e5", 4.0), NodeCapacity("ffee", 2.0, 2.0)], logical=True,
                        lost={"ffee": "10.0.0.7"})
    nodes = [node_view(n, snapshot, [lease(1, {"a1b2c3d4e5": 2})]) for n in snapshot.nodes]
    cluster = {"gpus_total": 6, "gpus_leased": 2, "gpus_free": 2, "gpus_unmanaged": 0, "gpus_lost": 2,
               "logical_gpus": True, "requests_queued": 0, "nodes": nodes}
    quota = {"max_gpus": None, "gpu_hours": None, "gpus_in_use": 2, "gpu_hours_7d": 0.5, "max_priority": "high"}
    run = {"lease_id": 1, "gpus": 2, "priority": "normal", "state": "placed", "age_s": 12.0, "position": None,
           "reason": None, "step": 340, "notebook": "work/train.ipynb"}
    text = str(Status(user="alice", cluster=cluster, quota=quota, leases=[run])).splitlines()
    assert text[1] == "  node a1b2c3d4: 4 GPUs · 2 in use · 2 free · 0 lent"
    assert text[2] == "  node ffee: 2 GPUs · 0 in use · 0 free · 0 lent · lost (10.0.0.7)"
    assert text[-1] == "  lease 1: 2 GPUs, normal, placed, 12 s, step 340, work/train.ipynb"
    background = str(Status(user="alice", cluster=cluster, quota=quota, leases=[{**run, "background": True}]))
    assert background.splitlines()[-1] == "  lease 1: 2 GPUs, normal, placed, 12 s, step 340, work/train.ipynb, background"
