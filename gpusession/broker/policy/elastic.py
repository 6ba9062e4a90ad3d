"""PURE: elastic leases (min_workers < workers): how few workers a preemptor takes from one, and
which free GPUs are offered back to leases that shrank.

A preemption takes from an elastic lease only the workers the preemptor needs, down to its
min_workers; the lease is told to shrink (a notice with a deadline) instead of to stop. When GPUs
are free again and nobody with an equal or higher claim waits for them, they are offered to the
leases that shrank, one worker at a time round robin (higher priority first, then the oldest
grant), so two shrunken leases share what comes back. No Ray, SQLite or clock in here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .model import EPSILON, ActiveLease, Placement, Request
from .placement import NodeGpus, NodeWorkers, give, plan, slots


@dataclass(frozen=True)
class Taking:
    """What a preemption takes from one victim: all of it (shrink_to None) or some workers."""

    lease: ActiveLease
    gpus: NodeGpus  # the GPUs it gives up, per node
    shrink_to: int | None = None  # workers it keeps; None: it stops
    give: NodeWorkers | None = None  # workers per node it gives up when it shrinks


@dataclass(frozen=True)
class Offer:
    """Free GPUs offered back to a lease that shrank: grow to `to_workers` (adding `add`)."""

    lease_id: int
    to_workers: int
    add: NodeWorkers


def can_shrink(lease: ActiveLease) -> bool:
    return lease.min_workers is not None and lease.workers > lease.min_workers


def node_workers(lease: ActiveLease, footprint: NodeGpus) -> NodeWorkers:
    """Workers per node of a lease (placed, or as the policy simulated it)."""
    if lease.node_workers is not None:
        return {node: n for node, n in lease.node_workers.items() if n}
    return {node: int(round(g / lease.gpus_per_worker)) for node, g in footprint.items() if g > EPSILON}


def spare(lease: ActiveLease, where: NodeWorkers, count: int) -> NodeWorkers:
    """Which `count` workers the lease gives up: from the nodes where it has the fewest first,
    so what it keeps stays together (ties: the node listed last, deterministic)."""
    given: NodeWorkers = {}
    left = count
    for node in sorted(where, key=lambda n: (where[n], -list(where).index(n))):
        n = min(left, where[node])
        if n:
            given[node] = n
            left -= n
        if not left:
            break
    return given


def gpus(given: NodeWorkers, gpus_per_worker: float) -> NodeGpus:
    return {node: n * gpus_per_worker for node, n in given.items() if n}


def most_to_give(lease: ActiveLease, footprint: NodeGpus) -> NodeGpus:
    """The GPUs an elastic lease could give up at most (down to its min_workers)."""
    where = node_workers(lease, footprint)
    return gpus(spare(lease, where, lease.workers - lease.min_workers), lease.gpus_per_worker)


def fewest_to_give(request: Request, lease: ActiveLease, footprint: NodeGpus,
                   view: NodeGpus) -> Taking | None:
    """The smallest shrink of `lease` that makes `request` fit in `view` (free GPUs plus what
    other victims give), or None if even shrinking to min_workers does not."""
    where = node_workers(lease, footprint)
    for count in range(1, lease.workers - lease.min_workers + 1):
        for given in _ways_to_give(lease, where, count):
            trial = dict(view)
            give(trial, gpus(given, lease.gpus_per_worker), add_nodes=True)
            if plan(trial, request.workers, request.gpus_per_worker, request.placement) is not None:
                return Taking(lease, gpus(given, lease.gpus_per_worker), lease.workers - count, given)
    return None


def _ways_to_give(lease: ActiveLease, where: NodeWorkers, count: int):
    """`count` workers to give up: the usual choice (spare), then each node's first (a request
    that must sit on one node needs them together)."""
    yield spare(lease, where, count)
    for node in where:
        first = min(count, where[node])
        rest = spare(lease, {n: w for n, w in where.items() if n != node}, count - first)
        if sum(rest.values()) == count - first:
            yield {node: first, **rest}


def offers(leases: Sequence[ActiveLease], free: Mapping[str, float],
           waiting: Sequence[Request]) -> list[Offer]:
    """Free GPUs offered to leases below their full size, never past a request that waits with an
    equal or higher priority (it has the better claim on them)."""
    top_waiting = max((r.priority for r in waiting), default=None)
    growable = [lease for lease in leases if _may_grow(lease)
                and (top_waiting is None or lease.priority > top_waiting)]
    if not growable:
        return []
    growable.sort(key=lambda lease: (-lease.priority, lease.granted_at, lease.lease_id))
    room = dict(free)
    added: dict[int, NodeWorkers] = {lease.lease_id: {} for lease in growable}
    open_ = list(growable)
    while open_:  # one worker per lease per round: what comes back is shared
        still = []
        for lease in open_:
            node = _node_for_one(lease, added[lease.lease_id], room)
            if node is None:
                continue
            room[node] -= lease.gpus_per_worker
            added[lease.lease_id][node] = added[lease.lease_id].get(node, 0) + 1
            if lease.workers + sum(added[lease.lease_id].values()) < lease.full_workers:
                still.append(lease)
        open_ = still
    return [Offer(lease.lease_id, lease.workers + sum(add.values()), add)
            for lease in growable if (add := added[lease.lease_id])]


def _may_grow(lease: ActiveLease) -> bool:
    return (lease.full_workers is not None and lease.workers < lease.full_workers
            and lease.preempted_for is None and lease.node_workers is not None and not lease.noticed)


def _node_for_one(lease: ActiveLease, added: NodeWorkers, room: Mapping[str, float]) -> str | None:
    """A node with room for one more worker of this lease, keeping its placement's rule."""
    mine = dict(lease.node_workers or {})
    for node, n in added.items():
        mine[node] = mine.get(node, 0) + n
    fits = [node for node, free in room.items() if slots(free, lease.gpus_per_worker) >= 1]
    if lease.placement == Placement.STRICT_PACK:
        fits = [node for node in fits if node in mine]
    elif lease.placement == Placement.STRICT_SPREAD:
        fits = [node for node in fits if not mine.get(node)]
    if not fits:
        return None
    if lease.placement in (Placement.PACK, Placement.STRICT_PACK):  # next to its other workers
        return max(fits, key=lambda node: (mine.get(node, 0), room[node]))
    return min(fits, key=lambda node: (mine.get(node, 0), -room[node]))
