"""PURE: which leases a blocked request may take GPUs from, and the fewest it needs.

Invariant (DESIGN.md): a lease within quota is never preempted for a request of equal or
lower priority; only over-quota leases (priority <= the request's) and leases of strictly
lower priority can be victims. Leases already under notice are not chosen again.
"""
from __future__ import annotations

from typing import Iterable, Sequence

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


def notice(victim: ActiveLease, request: Request) -> Preempt:
    """The notice sent to a victim. Elastic shrinking (to min_workers) will decide
    `shrink_to_workers` here; for now every victim stops."""
    reason = OVER_QUOTA if victim.over_quota else LOWER_PRIORITY
    return Preempt(victim.lease_id, request.lease_id, reason, shrink_to_workers=None)
