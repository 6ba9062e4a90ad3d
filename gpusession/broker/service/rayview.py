"""One snapshot of what Ray really has: nodes, free GPUs, our placement groups, dead jobs."""
from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from ...cluster import liveness, rayprivate
from ...cluster.raycluster import nodes as alive_nodes
from ..policy.model import ActiveLease, NodeCapacity
from ...cluster.placement import PlacementState

PG_PREFIX = "gpusession"
PROBE_TIMEOUT_S = 1.0  # a node whose raylet does not answer a connect within this lends no GPUs
SETTLE_S = 10.0  # at most this long, a removed group of a lease still open counts as ours (a resize, a move)


def gcs_address() -> str:
    """The address of this cluster's GCS, as clients name the cluster (RAY_ADDRESS)."""
    return ray.get_runtime_context().gcs_address


def pg_name(ledger_id: str, lease_id: int) -> str:
    """Placement groups are named after the lease, with the ledger's id so two ledgers never collide."""
    return f"{PG_PREFIX}-{ledger_id}-{lease_id}"


@dataclass(frozen=True)
class GroupState:
    pg_id: str
    state: PlacementState
    node_workers: dict[str, int]
    gpus_by_node: dict[str, float]


@dataclass(frozen=True)
class Settling:
    """A group of ours that Ray removed lately: Ray's per-node view may still show its GPUs in use."""

    lease_id: int
    gpus_by_node: dict[str, float]
    since: float  # the first reading that no longer listed it as created


@dataclass(frozen=True)
class Snapshot:
    nodes: list[NodeCapacity]
    logical: bool  # every GPU node declares GPUs with no real accelerator behind them
    _: dataclasses.KW_ONLY  # the rest by name: a field added in between once broke a positional call
    groups: dict[int, GroupState] = field(default_factory=dict)  # lease id -> its group
    dead_jobs: dict[str, float] = field(default_factory=dict)  # job id -> when it ended
    raw_unmanaged: dict[str, float] = field(default_factory=dict)  # this reading, before smoothing
    lost: dict[str, str] = field(default_factory=dict)  # node id -> address: Ray lists it, it does not answer
    addresses: dict[str, str] = field(default_factory=dict)  # node id -> address, of every GPU node
    first_seen: dict[str, float] = field(default_factory=dict)  # node id -> the first reading that listed it
    live_jobs: frozenset[str] = frozenset()  # job ids Ray lists as running (a kernel, a driver)
    settling: dict[str, Settling] = field(default_factory=dict)  # group id -> one removed lately

    def with_lost(self, node_ids: Iterable[str]) -> "Snapshot":
        """This reading, with these nodes lost as well (a run reported them lost since it was taken)."""
        more = {n: self.addresses.get(n, "") for n in node_ids if n not in self.lost}
        return dataclasses.replace(self, lost={**self.lost, **more}) if more else self

    def nodes_for(self, active: Iterable[ActiveLease]) -> list[NodeCapacity]:
        """PURE: the nodes as a decision must see them, given the leases active now. A lost node
        lends nothing: every GPU on it is unavailable but those active leases still hold there
        (they go with those leases). Taken from the books, not from Ray's group table at the time
        of the reading: a lease released since then would otherwise leave its GPUs on the lost
        node looking free, and a request could be granted that Ray cannot place."""
        if not self.lost:
            return self.nodes
        held: dict[str, float] = {}
        for lease in active:
            for node_id, workers in (lease.node_workers or {}).items():
                held[node_id] = held.get(node_id, 0.0) + workers * lease.gpus_per_worker
        return [NodeCapacity(n.node_id, n.gpus, round(max(0.0, n.gpus - held.get(n.node_id, 0.0)), 6))
                if n.node_id in self.lost else n for n in self.nodes]


def take(ledger_id: str, previous: Snapshot | None = None, open_leases: Iterable[int] = ()) -> Snapshot:
    """Read Ray once, and probe each GPU node (liveness.py). Unmanaged GPUs are those in use on a
    node beyond our own groups: those Ray holds as created, and those removed while their lease
    is still open in the books (`open_leases`, as they were before this reading began). A caller
    removes its group, waits until Ray's view shows the GPUs free, and only then tells the broker
    its lease ended; a reading in between saw the GPUs neither in a group nor free, and counted
    them as used outside gpusession while the books still counted them leased (seen: a user's
    gs.status() right after a run on two hosts showed 3 of 5 GPUs free). Of this and the previous
    reading the smaller is kept, so a transient does not look like foreign use either. A node that
    does not answer keeps its place (a request it could hold stays feasible, it may come back) but
    lends nothing: all of its GPUs that our groups do not hold count as unavailable, until it
    answers again."""
    still_open = frozenset(open_leases)
    groups = _our_groups(ledger_id)
    free = {n: r.get("GPU", 0.0) for n, r in rayprivate.available_resources_per_node().items()}
    now = time.time()
    settling = settling_groups(previous, groups, still_open, now)
    ours: dict[str, float] = {}
    for gpus_by_node in [g.gpus_by_node for g in groups.values() if g.state == PlacementState.CREATED] + [
            s.gpus_by_node for s in settling.values()]:
        for node_id, gpus in gpus_by_node.items():
            ours[node_id] = ours.get(node_id, 0.0) + gpus
    before = previous.raw_unmanaged if previous else {}
    infos = [info for info in alive_nodes() if info.gpus > 0]
    first_seen = {i.node_id: (previous.first_seen if previous else {}).get(i.node_id, now) for i in infos}
    silent = liveness.unreachable({i.node_id: (i.address, i.raylet_port) for i in infos}, timeout_s=PROBE_TIMEOUT_S)
    silent |= replaced(infos, first_seen)
    nodes, logical, raw, lost = [], True, {}, {}
    for info in infos:
        logical = logical and info.logical
        if info.node_id in silent:
            lost[info.node_id] = info.address
            nodes.append(NodeCapacity(info.node_id, info.gpus, round(max(0.0, info.gpus - ours.get(info.node_id, 0.0)), 6)))
            continue
        used = info.gpus - free.get(info.node_id, info.gpus)
        raw[info.node_id] = max(0.0, used - ours.get(info.node_id, 0.0))
        unmanaged = min(raw[info.node_id], before.get(info.node_id, raw[info.node_id]))
        nodes.append(NodeCapacity(info.node_id, info.gpus, round(unmanaged, 6)))
    dead, live = _jobs()
    return Snapshot(nodes, logical and bool(nodes), groups=groups, dead_jobs=dead, raw_unmanaged=raw, lost=lost,
                    addresses={info.node_id: info.address for info in infos}, first_seen=first_seen,
                    live_jobs=live, settling=settling)


def settling_groups(previous: Snapshot | None, groups: dict[int, GroupState], open_leases: frozenset[int],
                    now: float) -> dict[str, Settling]:
    """PURE: by group id, the groups that the previous reading listed as created and this one does
    not (removed, or gone from Ray's table), while their lease is open in the books and for at
    most SETTLE_S from the first reading that missed them (a lease that resized or moved holds a
    new group: its old one's GPUs are free by then)."""
    if previous is None:
        return {}
    created = {g.pg_id for g in groups.values() if g.state == PlacementState.CREATED}
    missed = {g.pg_id: Settling(lease_id, dict(g.gpus_by_node), now) for lease_id, g in previous.groups.items()
              if g.state == PlacementState.CREATED and g.pg_id not in created}
    candidates = {**missed, **previous.settling}  # an earlier entry keeps its first time
    return {pg: s for pg, s in candidates.items()
            if pg not in created and s.lease_id in open_leases and now - s.since < SETTLE_S}


def replaced(infos, first_seen: dict[str, float]) -> set[str]:
    """PURE: nodes whose raylet address and port a node listed later has now. A host whose Ray
    was started again on the same ports answers the probe for its old node too, which Ray lists
    as alive until it declares it dead; only one raylet can hold the port: the newer node's."""
    newest: dict[tuple[str, int], float] = {}
    for info in infos:
        if info.raylet_port:
            key = (info.address, info.raylet_port)
            newest[key] = max(newest.get(key, 0.0), first_seen[info.node_id])
    return {info.node_id for info in infos
            if info.raylet_port and first_seen[info.node_id] < newest[(info.address, info.raylet_port)]}


def _our_groups(ledger_id: str) -> dict[int, GroupState]:
    pattern = re.compile(rf"^{PG_PREFIX}-{re.escape(ledger_id)}-(\d+)$")
    found: dict[int, GroupState] = {}
    for pg_id, entry in ray.util.placement_group_table().items():
        match = pattern.match(entry.get("name") or "")
        if not match:
            continue
        lease_id = int(match.group(1))
        node_workers: dict[str, int] = {}
        gpus_by_node: dict[str, float] = {}
        bundles = entry.get("bundles", {})
        for index, node_id in (entry.get("bundles_to_node_id") or {}).items():
            node_workers[node_id] = node_workers.get(node_id, 0) + 1
            gpus = float(bundles.get(index, {}).get("GPU", 0.0))
            gpus_by_node[node_id] = gpus_by_node.get(node_id, 0.0) + gpus
        current = GroupState(pg_id, PlacementState.parse(entry.get("state")), node_workers, gpus_by_node)
        # a lease has one live group; removed ones from earlier tries must not hide it
        if lease_id not in found or found[lease_id].state == PlacementState.REMOVED:
            found[lease_id] = current
    return found


def placed_leases(ledger_id: str) -> set[int]:
    """The leases whose placement group Ray has created and holds now (read from the GCS)."""
    return {lease_id for lease_id, group in _our_groups(ledger_id).items()
            if group.state == PlacementState.CREATED}


def _jobs() -> tuple[dict[str, float], frozenset[str]]:
    """Ray's jobs in one reading: the dead ones with when each ended, and the ids of the live ones."""
    jobs = rayprivate.jobs()
    dead = {job["JobID"]: (job.get("EndTime") or 0) / 1000.0 for job in jobs if job.get("IsDead")}
    return dead, frozenset(job["JobID"] for job in jobs if not job.get("IsDead"))


def remove_group(pg_id: str) -> None:
    """Remove a placement group by id; Ray kills whatever runs inside it."""
    try:
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
    except Exception:  # already gone
        pass


def joined(before: Snapshot, after: Snapshot) -> list[str]:
    """PURE: GPU nodes that answer in this reading and did not in the last: new ones (a host
    started again comes back as a new node) and lost ones back."""
    return [node_id for node_id in after.first_seen
            if node_id not in after.lost and (node_id not in before.first_seen or node_id in before.lost)]


@ray.remote(num_cpus=0, max_retries=0)
def _sweep_scratch() -> int:
    from ...run.node import scratch
    from ...run.spec import scratch_root

    return len(scratch.remove_stale(scratch_root()))


def sweep_scratch_on(node_ids: Iterable[str]) -> None:
    """On each of these nodes, remove the scratch directories no live rank holds: a host that
    starts again sweeps what the ranks it lost left, whether or not work lands there. Fire and
    forget: a zero-CPU task pinned to the node (a node that leaves meanwhile just fails it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for node_id in node_ids:
        _sweep_scratch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def kill_actors(handles) -> None:
    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already dead
            pass
