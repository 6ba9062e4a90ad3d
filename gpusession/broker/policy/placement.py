"""PURE placement arithmetic: where the workers of one gang would go, and GPUs per node.

`plan` is the one fit function the policy uses for queued requests, for granted leases Ray has
not placed yet, for preemption and for reservations, so that they all agree on what "fits"
means. GPU counts are floats (fractional workers share a GPU); comparisons use EPSILON.
Capacity is judged per node as a float, the way the policy sees it; Ray has the last word on
how fractional bundles share the physical GPUs of a node.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .model import EPSILON, NodeCapacity, Placement

NodeWorkers = dict[str, int]  # node id -> workers of one lease placed there
NodeGpus = dict[str, float]  # node id -> GPUs
Plan = NodeWorkers | None  # None: the gang does not fit now


def slots(free: float, gpus_per_worker: float) -> int:
    """How many workers of `gpus_per_worker` GPUs fit in `free` GPUs of one node."""
    if free < gpus_per_worker - EPSILON:
        return 0
    return int((free + EPSILON) // gpus_per_worker)


def plan(
    free_by_node: Mapping[str, float],
    workers: int,
    gpus_per_worker: float,
    placement: Placement | str,
) -> Plan:
    """Workers per node for a gang that must be placed whole, or None if it does not fit now.

    pack: one node if any can take the gang (best fit: the fullest such node, to keep big
    holes for big gangs), else spread over the nodes with most free GPUs first.
    spread: round robin over the nodes with room, emptiest first.
    strict_pack: one node (best fit) or nothing. strict_spread: distinct nodes, emptiest first.
    Ties go to the node listed first, so the answer is deterministic.
    """
    if workers <= 0:
        return {}
    if placement == Placement.STRICT_SPREAD:
        return _strict_spread(free_by_node, workers, gpus_per_worker)
    if placement == Placement.SPREAD:
        return _round_robin(free_by_node, workers, gpus_per_worker)
    node = _best_fit(free_by_node, workers, gpus_per_worker)
    if node is not None:
        return {node: workers}
    if placement == Placement.STRICT_PACK:
        return None
    return _most_free_first(free_by_node, workers, gpus_per_worker)


def _best_fit(free_by_node: Mapping[str, float], workers: int, gpw: float) -> str | None:
    need = workers * gpw - EPSILON
    best, best_free = None, 0.0
    for node, free in free_by_node.items():
        if free >= need and (best is None or free < best_free) and slots(free, gpw) >= workers:
            best, best_free = node, free
    return best


def _emptiest_first(free_by_node: Mapping[str, float]) -> list[str]:
    # sorted() is stable, so equally free nodes keep their listed order
    return sorted(free_by_node, key=free_by_node.__getitem__, reverse=True)


def _most_free_first(free_by_node: Mapping[str, float], workers: int, gpw: float) -> Plan:
    placed: NodeWorkers = {}
    left = workers
    for node in _emptiest_first(free_by_node):
        n = min(left, slots(free_by_node[node], gpw))
        if n:
            placed[node] = n
            left -= n
            if not left:
                return placed
    return None


def _round_robin(free_by_node: Mapping[str, float], workers: int, gpw: float) -> Plan:
    room = {node: slots(free_by_node[node], gpw) for node in _emptiest_first(free_by_node)}
    room = {node: n for node, n in room.items() if n}
    if sum(room.values()) < workers:
        return None
    placed: NodeWorkers = {}
    left = workers
    while left:
        for node in room:
            if left and placed.get(node, 0) < room[node]:
                placed[node] = placed.get(node, 0) + 1
                left -= 1
    return placed


def _strict_spread(free_by_node: Mapping[str, float], workers: int, gpw: float) -> Plan:
    nodes = [node for node in _emptiest_first(free_by_node) if slots(free_by_node[node], gpw)]
    if len(nodes) < workers:
        return None
    return {node: 1 for node in nodes[:workers]}


def gpus_of(node_workers: Mapping[str, int], gpus_per_worker: float) -> NodeGpus:
    """GPUs per node of a placement."""
    return {node: n * gpus_per_worker for node, n in node_workers.items() if n}


def take(free_by_node: dict[str, float], gpus: Mapping[str, float]) -> None:
    """Occupy `gpus` (per node) in `free_by_node`, in place. Unknown nodes are ignored."""
    for node, n in gpus.items():
        if node in free_by_node:
            free_by_node[node] -= n


def give(
    free_by_node: dict[str, float], gpus: Mapping[str, float], *, add_nodes: bool = False
) -> None:
    """Free `gpus` (per node) in `free_by_node`, in place. Unknown nodes are ignored, or added."""
    for node, n in gpus.items():
        if node in free_by_node:
            free_by_node[node] += n
        elif add_nodes:
            free_by_node[node] = n


def drain(free_by_node: Mapping[str, float], gpus: float) -> NodeGpus:
    """Where `gpus` GPUs that fit no placement are charged: the freest nodes first, never below 0.

    Used for a granted lease that no longer fits the cluster as the policy sees it (a node
    shrank); its GPUs must still count as taken somewhere.
    """
    charged: NodeGpus = {}
    left = gpus
    for node in _emptiest_first(free_by_node):
        amount = min(left, max(free_by_node[node], 0.0))
        if amount > EPSILON:
            charged[node] = amount
            left -= amount
        if left <= EPSILON:
            break
    return charged


def cluster_limit(
    nodes: Iterable[NodeCapacity], gpus_per_worker: float, placement: Placement | str
) -> int:
    """The most workers of this size the cluster could ever hold at once (node totals, idle)."""
    per_node = [slots(node.gpus, gpus_per_worker) for node in nodes]
    if placement == Placement.STRICT_PACK:
        return max(per_node, default=0)
    if placement == Placement.STRICT_SPREAD:
        return sum(1 for n in per_node if n)
    return sum(per_node)
