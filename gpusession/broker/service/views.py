"""Plain-dict views the broker hands out: one lease, the cluster, quotas, usage reports."""
from __future__ import annotations

import datetime as dt
from typing import Iterable

from ..storage.books import Books
from ..storage.ledger import QuotaRow
from ..policy.model import Quota, Waiting
from .rayview import Snapshot
from ..policy.states import LeaseState

DAY_S = 86400.0


def lease_view(row: dict, *, waiting: Waiting | None, version: int, now: float) -> dict:
    notice = row.get("notice") or {}
    held_since = row.get("granted_at")
    return {
        "lease_id": row["id"],
        "user": row["user"],
        "gpus": row["gpus"],
        "workers": row["workers"],
        "gpus_per_worker": row["gpus_per_worker"],
        "priority": row["priority"].label,
        "placement": row["placement"],
        "state": str(row["state"]),
        "over_quota": bool(row.get("over_quota")),
        "requested_at": row["requested_at"],
        "granted_at": held_since,
        "released_at": row.get("released_at"),
        "age_s": now - (held_since or row["requested_at"]) if row["state"] != LeaseState.ENDED else None,
        "position": waiting.position if waiting else None,
        "wait_kind": waiting.kind.value if waiting else None,
        "reason": waiting.reason if waiting else None,
        "end_reason": row.get("end_reason"),
        "gpu_seconds": row.get("gpu_seconds"),
        "node_workers": row.get("node_workers"),
        "gpu_ids": row.get("gpu_ids"),
        "notice": notice if notice.get("kind") else None,
        "error": notice.get("error"),
        "message": notice.get("message"),
        "version": version,
        "sweep_id": row.get("sweep_id"),
        "notebook": row.get("notebook"),
        "cell_id": row.get("cell_id"),
        "background": bool(row.get("background")),
    }


def cluster_view(snapshot: Snapshot, books: Books) -> dict:
    total = sum(n.gpus for n in snapshot.nodes)
    nodes = snapshot.nodes_for(books.active())
    unavailable = sum(n.unmanaged for n in nodes)  # a lost node's GPUs count here too
    leased = sum(lease.gpus for lease in books.active())
    queued = [r for r in books.rows.values() if r["state"] == LeaseState.QUEUED]
    return {
        "gpus_total": total,
        "gpus_leased": leased,
        "gpus_unmanaged": sum(n.unmanaged for n in snapshot.nodes if n.node_id not in snapshot.lost),
        "gpus_lost": sum(n.gpus for n in snapshot.nodes if n.node_id in snapshot.lost),
        "gpus_free": max(0.0, total - leased - unavailable),
        "logical_gpus": snapshot.logical,
        "nodes": [node_view(n, snapshot, books.active()) for n in snapshot.nodes],
        "leases_active": len(books.active()),
        "requests_queued": len(queued),
        "gpus_queued": sum(r["gpus"] for r in queued),
    }


def node_view(node, snapshot: Snapshot, active: list) -> dict:
    """One node's GPUs: leased (placed there), lent (the part of it over its users' quotas),
    unmanaged (held outside the broker), lost, and free (none on a lost node)."""
    lost = node.node_id in snapshot.lost
    placed = [(lease, (lease.node_workers or {}).get(node.node_id, 0)) for lease in active]
    leased = sum(workers * lease.gpus_per_worker for lease, workers in placed)
    lent = sum(workers * lease.gpus_per_worker for lease, workers in placed if lease.over_quota)
    unmanaged = 0.0 if lost else node.unmanaged
    return {"node_id": node.node_id, "gpus": node.gpus, "unmanaged": unmanaged, "lost": lost,
            "address": snapshot.lost.get(node.node_id), "leased": round(leased, 6), "lent": round(lent, 6),
            "free": 0.0 if lost else round(max(0.0, node.gpus - leased - unmanaged), 6)}


def quota_dict(quota: Quota) -> dict:
    return {"max_gpus": quota.max_gpus, "gpu_hours": quota.gpu_hours, "max_priority": quota.max_priority.label}


def quota_view(user: str, books: Books, rows: dict[str, QuotaRow], hours_7d: dict[str, float]) -> dict:
    """hours_7d: GPU-hours per user over the last 7 days (computed once per call, not per user)."""
    quota = books.quota_for(user)
    held = sum(l.gpus for l in books.active() if l.user == user)
    row = rows.get(user)
    return {
        "user": user,
        **quota_dict(quota),
        "is_default": row is None,
        "gpus_in_use": held,
        "gpu_hours_7d": round(hours_7d.get(user, 0.0), 6),
        "updated_at": row.updated_at if row else None,
        "updated_by": row.updated_by if row else None,
    }


def usage_report(intervals: Iterable[tuple], *, by: str) -> list[dict]:
    """GPU-seconds per user, or per user and UTC day (each interval split at midnight)."""
    totals: dict[tuple, float] = {}
    for user, gpus, start, end in intervals:
        if end <= start:
            continue
        if by == "user":
            key = (user,)
            totals[key] = totals.get(key, 0.0) + gpus * (end - start)
            continue
        cursor = start
        while cursor < end:
            day = dt.datetime.fromtimestamp(cursor, dt.timezone.utc).date()
            midnight = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone.utc).timestamp()
            piece_end = min(end, midnight)
            key = (user, day.isoformat())
            totals[key] = totals.get(key, 0.0) + gpus * (piece_end - cursor)
            cursor = piece_end
    if by == "user":
        return [{"user": k[0], "gpu_seconds": round(v, 3)} for k, v in sorted(totals.items())]
    return [{"user": k[0], "day": k[1], "gpu_seconds": round(v, 3)} for k, v in sorted(totals.items())]
