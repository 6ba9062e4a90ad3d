"""PURE: the words users read. Rejections say what happened, the numbers, and the next step
(STYLE.md rule 5); waiting reasons are short enough for the cell's one live line."""
from __future__ import annotations

import math
from typing import Sequence

from .model import NodeCapacity, Placement, Priority, Quota, Reject, Request

INFEASIBLE = "Infeasible"
QUOTA_EXCEEDED = "QuotaExceeded"


def gpus_text(n: float) -> str:
    """'1 GPU', '2 GPUs', '0.5 GPUs': how every message counts GPUs."""
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def unplaceable(request: Request, nodes: Sequence[NodeCapacity], limit: int) -> Reject:
    """More workers than the cluster could ever hold with this placement."""
    gpw, placement = request.gpus_per_worker, Placement.parse(request.placement)
    shape = f"{_count(request.workers, 'worker')} x {gpus_text(gpw)}"
    if placement == Placement.STRICT_PACK:
        largest = max((n.gpus for n in nodes), default=0.0)
        what = f"on one node (strict_pack) but the largest node has {gpus_text(largest)}"
        fix = "or use placement='pack' to span nodes"
    elif placement == Placement.STRICT_SPREAD:
        what = f"on distinct nodes (strict_spread) but only {_count(limit, 'node')} can take one"
        fix = "or use placement='spread'"
    else:
        size = f"{_count(len(nodes), 'node')}, {gpus_text(sum(n.gpus for n in nodes))}"
        what = f"but the cluster ({size}) can place at most {limit * gpw:g}"
        fix = "or add nodes to the cluster"
    most = limit * gpw
    return Reject(
        request.lease_id,
        INFEASIBLE,
        f"Needs {gpus_text(request.gpus)} ({shape}) {what}. Ask for at most {most:g} GPUs, {fix}.",
    )


def over_ceiling(request: Request, *, ceiling: float, quota: Quota, borrowing: bool) -> Reject:
    """More than the user may ever hold: max_gpus, or the cluster size when borrowing."""
    user = request.user
    if borrowing:
        detail = f"{user} may borrow up to the cluster size, {gpus_text(ceiling)}"
        fix = "or add nodes to the cluster"
    else:
        detail = f"{user} may hold {ceiling:g} (quota max_gpus={quota.max_gpus:g})"
        fix = f"or ask an admin to raise {user}'s quota"
    return Reject(
        request.lease_id,
        INFEASIBLE,
        f"Needs {gpus_text(request.gpus)} but {detail}. Ask for at most {ceiling:g}, {fix}.",
    )


def priority_too_high(request: Request, quota: Quota) -> Reject:
    top = Priority(quota.max_priority).label
    return Reject(
        request.lease_id,
        QUOTA_EXCEEDED,
        f"Asks for priority {Priority(request.priority).label} but {request.user} may use at most "
        f"{top} (quota max_priority={top}). Use priority='{top}', "
        f"or ask an admin to raise {request.user}'s max_priority.",
    )


def budget_spent(user: str, *, used: float, quota: Quota) -> str:
    return (
        f"{user} has used {used:.1f} of {quota.gpu_hours:g} GPU-hours in the last 7 days "
        f"(quota gpu_hours={quota.gpu_hours:g}). Wait until older usage leaves the 7-day "
        f"window, or ask an admin to raise {user}'s budget."
    )


# Waiting reasons (one line, lower case: "waiting for ...")


def capacity(in_use: float, total: float) -> str:
    return f"waiting for capacity: {in_use:g} of {total:g} GPUs in use"


def held_for_earlier(in_use: float, total: float) -> str:
    return capacity(in_use, total) + "; the free ones are held for a request ahead of this one"


def next_in_line(in_use: float, total: float, *, starts_in_s: float) -> str:
    text = capacity(in_use, total) + "; next in line"
    if math.isfinite(starts_in_s):
        text += f", expected within {_duration(starts_in_s)}"
    return text


def quota(user: str, *, holds: float, max_gpus: float, borrowing: bool) -> str:
    text = f"waiting for quota: {user} holds {holds:g} of max {gpus_text(max_gpus)}"
    return text + " and no GPUs are idle to borrow" if borrowing else text


def preemption(victims: int) -> str:
    if victims == 1:
        return "waiting for 1 preempted lease to release its GPUs"
    return f"waiting for {victims} preempted leases to release their GPUs"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def not_placed(gpus: float, waited_s: float, cluster: dict | None) -> str:
    """Why a granted lease's placement group was not placed in time, as far as the broker knows
    (`cluster`: its cluster view, None if it did not answer). "Outside gpusession" only when
    Ray shows GPUs in use that no lease accounts for."""
    head = f"The broker granted {gpus_text(gpus)} but Ray could not place them within {waited_s:.0f} s"
    lost = [n for n in (cluster or {}).get("nodes", []) if n.get("lost")]
    if lost:
        names = ", ".join(f"{n['node_id'][:12]} ({n.get('address') or 'no address'})" for n in lost)
        return (f"{head}: node {names} was lost (it does not answer; Ray has not declared it dead yet). "
                "Nothing was billed. Try again: the broker lends only the nodes that answer.")
    unmanaged = (cluster or {}).get("gpus_unmanaged") or 0.0
    if unmanaged > 0:
        return (f"{head}: something outside gpusession is using {gpus_text(unmanaged)} (Ray shows them in use "
                "and no lease holds them). Nothing was billed. Try again, or ask who uses Ray directly.")
    why = "the broker did not answer" if cluster is None else "no node was lost and nothing outside gpusession uses GPUs"
    return f"{head} ({why}). Nothing was billed. Try again."
