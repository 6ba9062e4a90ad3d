"""PURE scheduling decisions: plain values in (model.py), decision values out.

No Ray, SQLite or clock in here: time arrives as `now`. The broker calls `check_admission`
once per arriving request and `decide` after every change and about once a second.

How `decide` schedules (SPEC section 4; the walk itself is scheduler.Run):
- requests in priority order, then arrival; a gang gets all its workers placed or waits;
- within a priority, requests that fit their owner's quota go first; a borrower (beyond
  max_gpus, allow_borrowing on) then gets only idle GPUs, and its lease is over quota;
- a request within quota that does not fit may preempt (over-quota leases, then lower
  priority, newest first, no more than it needs); the first one preemption cannot help is
  the head: it reserves its start (board.Reservation), and later requests only backfill;
- everyone still waiting gets a 1-based position and a one-line reason.
"""
from __future__ import annotations

from itertools import count
from operator import attrgetter
from typing import Mapping, Sequence

from . import messages
from .board import build_board
from .model import (
    EPSILON,
    ActiveLease,
    Decision,
    NodeCapacity,
    Quota,
    Reject,
    Request,
    Waiting,
    WaitKind,
)
from .placement import cluster_limit
from .scheduler import Run, Users, Wait


def check_admission(
    request: Request,
    *,
    nodes: Sequence[NodeCapacity],
    quota: Quota,
    used_gpu_hours: float,
    allow_borrowing: bool,
) -> Reject | None:
    """Reject at once what can never run or is beyond the user's quota; None: it may queue."""
    limit = cluster_limit(nodes, request.gpus_per_worker, request.placement)
    if request.workers > limit:
        return messages.unplaceable(request, nodes, limit)
    ceiling = _ceiling(quota, nodes, allow_borrowing=allow_borrowing)
    if request.gpus > ceiling + EPSILON:
        return messages.over_ceiling(
            request, ceiling=ceiling, quota=quota, borrowing=allow_borrowing
        )
    if request.priority > quota.max_priority:
        return messages.priority_too_high(request, quota)
    if quota.gpu_hours is not None and used_gpu_hours >= quota.gpu_hours:
        message = messages.budget_spent(request.user, used=used_gpu_hours, quota=quota)
        return Reject(request.lease_id, messages.QUOTA_EXCEEDED, message)
    return None


def free_gpus(nodes: Sequence[NodeCapacity], leases: Sequence[ActiveLease]) -> dict[str, float]:
    """Free GPUs per node once every active lease (placed, or simulated) is counted."""
    return dict(build_board(nodes, leases, set()).free)


def _ceiling(quota: Quota, nodes: Sequence[NodeCapacity], *, allow_borrowing: bool) -> float:
    """The most GPUs the user may ever hold: max_gpus, or the whole cluster when borrowing."""
    if allow_borrowing or quota.max_gpus is None:
        return sum(node.gpus for node in nodes)
    return quota.max_gpus


def decide(
    *,
    nodes: Sequence[NodeCapacity],
    leases: Sequence[ActiveLease],
    queue: Sequence[Request],
    quotas: Mapping[str, Quota],
    default_quota: Quota,
    used_gpu_hours: Mapping[str, float],
    allow_borrowing: bool,
    now: float,
) -> Decision:
    """Grants, preemptions, rejections and the waiting list (position, reason) for this state."""
    run = Run(
        board=build_board(nodes, leases, _noticed_targets(leases, queue)),
        leases=leases,
        users=Users(quotas, default_quota, used_gpu_hours, leases),
        borrowing=allow_borrowing,
        now=now,
    )
    ids, waits = run.schedule(_in_order(queue))
    _explain(set(waits), run, nodes=nodes, leases=leases)
    _fill_waiting(run.decision.waiting, ids, waits)
    return run.decision


_BY_ARRIVAL = attrgetter("arrival")
_BY_PRIORITY = attrgetter("priority")
_LEASE_ID = attrgetter("lease_id")


def _in_order(queue: Sequence[Request]) -> list[Request]:
    """Priority, then arrival, then lease id: the same decision whatever order the queue comes in
    (Hypothesis found two requests of equal arrival decided by their position in the input).

    Stable C-level sorts beat one sort with a Python key (10,000 requests, every second), and a
    queue given in id and arrival order sorts in linear time."""
    order = sorted(queue, key=_LEASE_ID)
    order.sort(key=_BY_ARRIVAL)
    order.sort(key=_BY_PRIORITY, reverse=True)
    return order


def _noticed_targets(leases: Sequence[ActiveLease], queue: Sequence[Request]) -> set[int]:
    """Queued requests that leases under notice are making room for."""
    targets = {lease.preempted_for for lease in leases if lease.preempted_for is not None}
    return targets.intersection(map(_LEASE_ID, queue)) if targets else targets


def _explain(
    waits: set[Wait], run: Run, *, nodes: Sequence[NodeCapacity], leases: Sequence[ActiveLease]
) -> None:
    """Give each distinct reason its text, once, with the numbers as they are after this call,
    and the shared Waiting values of that text."""
    total = sum(n.gpus for n in nodes)
    unmanaged = total - sum(run.board.capacity.values())
    in_use = unmanaged + sum(lease.gpus for lease in leases)
    in_use += sum(request.gpus for request, _ in run.granted)
    _trim_shared()
    for wait in waits:
        what = wait.code[0]
        if what == "quota":
            user = run.users[wait.code[1]]
            wait.kind = WaitKind.QUOTA
            wait.reason = messages.quota(
                user.name, holds=user.usage, max_gpus=user.max_gpus, borrowing=run.borrowing
            )
        elif what == "preemption":
            wait.kind, wait.reason = WaitKind.PREEMPTION, messages.preemption(wait.code[1])
        else:
            wait.kind = WaitKind.CAPACITY
            wait.reason = _capacity_reason(what, run, in_use=in_use, total=total)
        wait.shared = _shared(wait.kind, wait.reason)


def _capacity_reason(what: str, run: Run, *, in_use: float, total: float) -> str:
    if what == "head":
        starts_in = run.head.at - run.now
        return messages.next_in_line(in_use, total, starts_in_s=starts_in)
    if what == "held":
        return messages.held_for_earlier(in_use, total)
    return messages.capacity(in_use, total)


# Waiting values carry no lease id, so equal ones are shared, within a call and across calls:
# a long queue shows the same (position, reason) pairs decision after decision, and building
# 10,000 new objects would cost a third of the decision on a small machine. Immutable values
# only; bounded (about 10 MB); emptied when full.
_SHARED: dict[tuple[WaitKind, str], dict[int, Waiting]] = {}
_SHARED_MAX = 100_000
_shared_size = [0]


def _shared(kind: WaitKind, reason: str) -> dict[int, Waiting]:
    """position -> Waiting(position, kind, reason), filled as positions are needed."""
    return _SHARED.setdefault((kind, reason), {})


def _trim_shared() -> None:
    if _shared_size[0] > _SHARED_MAX:
        _SHARED.clear()
        _shared_size[0] = 0


def _fill_waiting(waiting: dict[int, Waiting], ids: list[int], waits: list[Wait]) -> None:
    """waiting[id] = Waiting(position, kind, reason), positions 1..n in order."""
    make = tuple.__new__  # what Waiting(...) does, without its Python-level __new__
    made = 0
    for position, lease_id, wait in zip(count(1), ids, waits):
        value = wait.shared.get(position)
        if value is None:
            value = wait.shared[position] = make(Waiting, (position, wait.kind, wait.reason))
            made += 1
        waiting[lease_id] = value
    _shared_size[0] += made
