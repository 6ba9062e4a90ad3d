"""PURE: which leases a blocked request may take GPUs from, and the fewest it needs.

Invariant (DESIGN.md): a lease within quota is never preempted for a request of equal or
lower priority; only over-quota leases (priority <= the request's) and leases of strictly
lower priority can be victims. Leases already under notice are not chosen again.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from . import elastic
from .elastic import Taking
from .model import EPSILON, ActiveLease, Preempt, Request
from .placement import NodeGpus, give, plan, take

OVER_QUOTA = "over quota"
LOWER_PRIORITY = "lower priority"


def newest_first(leases: Iterable[ActiveLease]) -> list[ActiveLease]:
    """Leases that may still be preempted, in the order they are taken within a tier."""
    free_to_take = [lease for lease in leases if lease.preempted_for is None]
    return sorted(free_to_take, key=lambda lease: (lease.granted_at, lease.lease_id), reverse=True)


def eligible(request: Request, pool: Sequence[ActiveLease], *, in_quota: bool) -> list[ActiveLease]:
    """Victims in the order they are taken: over-quota leases first, then lower priority.

    A request within its owner's quota may take over-quota leases of its priority or lower; a
    request beyond its quota (borrowing) only leases of strictly lower priority.
    """
    prio = request.priority
    if in_quota:
        over = [lease for lease in pool if lease.over_quota and lease.priority <= prio]
    else:
        over = [lease for lease in pool if lease.over_quota and lease.priority < prio]
    lower = [lease for lease in pool if not lease.over_quota and lease.priority < prio]
    return over + lower


def choose_victims(
    request: Request,
    *,
    candidates: Sequence[ActiveLease],
    footprint: dict[int, NodeGpus],
    free: NodeGpus,
) -> list[ActiveLease] | None:
    """Victims, in candidate order, that make `request` fit, none of them spare; None if even
    all candidates would not do.

    `free` is what the request may already count on (free GPUs plus victims already releasing
    for it). Candidates are added until the request fits with its placement, then any chosen
    one it can do without is dropped again, last chosen first.
    """
    reachable = sum(f for f in free.values() if f > 0)
    reachable += sum(sum(footprint[lease.lease_id].values()) for lease in candidates)
    if reachable < request.gpus - EPSILON:
        return None  # not even all of them would do
    view = dict(free)
    chosen: list[ActiveLease] = []
    for lease in candidates:
        give(view, footprint[lease.lease_id])
        chosen.append(lease)
        if _fits(view, request):
            return _without_spares(chosen, view, request, footprint)
    return None


def _without_spares(chosen, view, request, footprint) -> list[ActiveLease]:
    kept = list(chosen)
    for lease in reversed(chosen):
        take(view, footprint[lease.lease_id])
        if _fits(view, request):
            kept.remove(lease)
        else:
            give(view, footprint[lease.lease_id])
    return kept


def _fits(view: NodeGpus, request: Request) -> bool:
    return plan(view, request.workers, request.gpus_per_worker, request.placement) is not None


def choose_takings(
    request: Request,
    *,
    candidates: Sequence[ActiveLease],
    footprint: dict[int, NodeGpus],
    free: NodeGpus,
) -> list[Taking] | None:
    """Like choose_victims, but an elastic victim (min_workers < workers) only shrinks, giving
    up the fewest workers the request needs. Only when shrinking every elastic candidate to its
    minimum would not do are they taken whole, like any other victim."""
    partial = {lease.lease_id: elastic.most_to_give(lease, footprint[lease.lease_id])
               for lease in candidates if elastic.can_shrink(lease)}
    offered = {**footprint, **partial}
    victims = choose_victims(request, candidates=candidates, footprint=offered, free=free)
    if victims is None and partial:
        return _whole(choose_victims(request, candidates=candidates, footprint=footprint, free=free),
                      footprint)
    if victims is None:
        return None
    view = dict(free)
    for victim in victims:
        give(view, offered[victim.lease_id], add_nodes=True)
    takings: list[Taking] = []
    for victim in reversed(victims):  # the last chosen gives the least it can
        if victim.lease_id not in partial:
            takings.append(Taking(victim, footprint[victim.lease_id]))
            continue
        take(view, offered[victim.lease_id])
        taking = elastic.fewest_to_give(request, victim, footprint[victim.lease_id], view)
        give(view, taking.gpus, add_nodes=True)
        takings.append(taking)
    return takings[::-1]


def _whole(victims: list[ActiveLease] | None, footprint: dict[int, NodeGpus]) -> list[Taking] | None:
    return None if victims is None else [Taking(v, footprint[v.lease_id]) for v in victims]


def notice(victim: ActiveLease, request: Request, taking: Taking | None = None) -> Preempt:
    """The notice sent to a victim: stop, or (an elastic victim) shrink to `taking.shrink_to`."""
    reason = OVER_QUOTA if victim.over_quota else LOWER_PRIORITY
    if taking is None or taking.shrink_to is None:
        return Preempt(victim.lease_id, request.lease_id, reason, shrink_to_workers=None)
    return Preempt(victim.lease_id, request.lease_id, reason, shrink_to_workers=taking.shrink_to,
                   give_node_workers=dict(taking.give or {}))
