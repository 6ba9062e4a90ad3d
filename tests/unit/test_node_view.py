"""What JupyterLab's sidebar shows per node: the GPUs leased there, the part lent beyond quotas,
what is free, and a lost node's GPUs as lost (never free)."""
from __future__ import annotations

from gpusession.broker.model import ActiveLease, NodeCapacity, Priority
from gpusession.broker.rayview import Snapshot
from gpusession.broker.views import node_view


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
