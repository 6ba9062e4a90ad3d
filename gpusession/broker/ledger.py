"""The broker's books in SQLite (through sqlite-utils): leases, quotas, settings, usage.

Every state change is one transaction, so a broker that crashes between two calls loses
nothing and counts nothing twice. Schema changes are registered migrations, applied in order.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import sqlite_utils

from .model import Priority, Quota

OPEN_STATES = ("queued", "granted", "placed")
ACTIVE_STATES = ("granted", "placed")
LEASE_COLUMNS = (
    "id request_id user job_id gpus workers gpus_per_worker min_workers priority placement "
    "max_hold_s queue_timeout_s state over_quota requested_at granted_at placed_at released_at "
    "end_reason gpu_seconds node_workers notice preempted_for"
).split()

MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = []


def migration(fn: Callable[[sqlite_utils.Database], None]):
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(db: sqlite_utils.Database) -> None:
    db["leases"].create(
        {
            "id": int, "request_id": str, "user": str, "job_id": str, "gpus": float,
            "workers": int, "gpus_per_worker": float, "min_workers": int, "priority": int,
            "placement": str, "max_hold_s": float, "queue_timeout_s": float, "state": str,
            "over_quota": int, "requested_at": float, "granted_at": float, "placed_at": float,
            "released_at": float, "end_reason": str, "gpu_seconds": float, "node_workers": str,
            "notice": str, "preempted_for": int,
        },
        pk="id",
        not_null={"user", "gpus", "state", "requested_at"},
        defaults={"over_quota": 0},
    )
    db["leases"].create_index(["request_id"], unique=True)
    db["leases"].create_index(["state"])
    db["leases"].create_index(["user", "released_at"])
    db["quotas"].create(
        {"user": str, "max_gpus": float, "gpu_hours": float, "max_priority": str,
         "updated_at": float, "updated_by": str},
        pk="user",
    )
    db["settings"].create({"key": str, "value": str}, pk="key")


@dataclass(frozen=True)
class QuotaRow:
    user: str
    quota: Quota
    updated_at: float | None
    updated_by: str | None


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(self.path)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.migrate()

    def migrate(self) -> list[str]:
        applied = []
        with self.db.conn:
            self.db["_migrations"].create({"name": str, "applied_at": float}, pk="name", if_not_exists=True)
            done = {row["name"] for row in self.db["_migrations"].rows}
            for name, fn in MIGRATIONS:
                if name not in done:
                    fn(self.db)
                    self.db["_migrations"].insert({"name": name, "applied_at": time.time()})
                    applied.append(name)
        return applied

    # ----- leases -------------------------------------------------------------------------
    def add_lease(self, row: dict[str, Any]) -> int:
        """Insert a request row and return its id (a prepared INSERT: this is the hot path)."""
        columns = [c for c in LEASE_COLUMNS if c != "id" and c in row]
        values = [int(row[c]) if c in ("priority", "over_quota") else _encode(row[c]) for c in columns]
        sql = f"insert into leases ({', '.join(columns)}) values ({', '.join('?' for _ in columns)})"
        with self.db.conn:
            return self.db.conn.execute(sql, values).lastrowid

    def lease_by_request_id(self, request_id: str) -> dict | None:
        rows = list(self.db.query("select * from leases where request_id = ?", [request_id]))
        return _decode(rows[0]) if rows else None

    def lease(self, lease_id: int) -> dict | None:
        rows = list(self.db.query("select * from leases where id = ?", [lease_id]))
        return _decode(rows[0]) if rows else None

    def open_leases(self) -> list[dict]:
        marks = ",".join("?" for _ in OPEN_STATES)
        sql = f"select * from leases where state in ({marks}) order by id"
        return [_decode(r) for r in self.db.query(sql, OPEN_STATES)]

    def recent_leases(self, *, user: str | None = None, limit: int = 200) -> list[dict]:
        where, args = ("where user = ?", [user]) if user else ("", [])
        sql = f"select * from leases {where} order by id desc limit ?"
        return [_decode(r) for r in self.db.query(sql, args + [limit])]

    def grant(self, grants: Iterable[tuple[int, bool]], now: float) -> None:
        with self.db.conn:
            self.db.conn.executemany(
                "update leases set state='granted', granted_at=?, over_quota=? where id=? and state='queued'",
                [(now, int(over), lease_id) for lease_id, over in grants],
            )

    def place(self, lease_id: int, node_workers: dict[str, int], now: float) -> None:
        with self.db.conn:
            self.db.execute(
                "update leases set state='placed', placed_at=?, node_workers=? "
                "where id=? and state='granted'",
                [now, json.dumps(node_workers), lease_id],
            )

    def set_notice(self, lease_id: int, notice: dict, preempted_for: int | None) -> None:
        with self.db.conn:
            self.db.execute(
                "update leases set notice=?, preempted_for=? where id=?",
                [json.dumps(notice), preempted_for, lease_id],
            )

    def close(self, row: dict, reason: str, released_at: float) -> dict | None:
        """End a lease exactly once; returns the closed row, or None if it had already ended.

        `row` is the caller's copy of the open row; the state check in the UPDATE makes a second
        close (a retried call, a race with reconciliation) change nothing."""
        granted = row.get("granted_at")
        released = max(released_at, granted) if granted is not None else released_at
        gpu_seconds = row["gpus"] * (released - granted) if granted is not None else 0.0
        marks = ",".join("?" for _ in OPEN_STATES)
        with self.db.conn:
            cursor = self.db.conn.execute(
                f"update leases set state='ended', end_reason=?, released_at=?, gpu_seconds=? "
                f"where id=? and state in ({marks})",
                [reason, released, gpu_seconds, row["id"], *OPEN_STATES],
            )
        if cursor.rowcount == 0:
            return None
        return {**row, "state": "ended", "end_reason": reason, "released_at": released, "gpu_seconds": gpu_seconds}

    # ----- quotas and settings --------------------------------------------------------------
    def quotas(self) -> dict[str, QuotaRow]:
        return {r["user"]: _quota_row(r) for r in self.db.query("select * from quotas")}

    def set_quota(self, user: str, quota: Quota, *, by: str, now: float) -> None:
        with self.db.conn:
            self.db["quotas"].upsert(
                {"user": user, "max_gpus": quota.max_gpus, "gpu_hours": quota.gpu_hours,
                 "max_priority": quota.max_priority.label, "updated_at": now, "updated_by": by},
                pk="user",
            )

    def reset_quota(self, user: str) -> bool:
        with self.db.conn:
            cursor = self.db.execute("delete from quotas where user = ?", [user])
        return cursor.rowcount > 0

    def setting(self, key: str, default: Any = None) -> Any:
        rows = list(self.db.query("select value from settings where key = ?", [key]))
        return json.loads(rows[0]["value"]) if rows else default

    def set_setting(self, key: str, value: Any) -> None:
        with self.db.conn:
            self.db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    # ----- usage ------------------------------------------------------------------------------
    def usage_intervals(self, since: float, until: float, user: str | None = None) -> list[tuple]:
        """(user, gpus, start, end) of every granted lease overlapping [since, until]."""
        sql = (
            "select user, gpus, granted_at, coalesce(released_at, ?) as end_at from leases "
            "where granted_at is not null and granted_at < ? and (released_at is null or released_at > ?)"
        )
        args: list[Any] = [until, until, since]
        if user:
            sql += " and user = ?"
            args.append(user)
        return [
            (r["user"], r["gpus"], max(r["granted_at"], since), min(r["end_at"], until))
            for r in self.db.query(sql, args)
        ]

    def outcome_counts(self) -> dict[str, int]:
        """Leases by end reason (ended) or state (open), over the whole ledger."""
        sql = ("select case when state = 'ended' then coalesce(end_reason, 'unknown') else state end as outcome, "
               "count(*) as n from leases group by outcome")
        return {row["outcome"]: row["n"] for row in self.db.query(sql)}

    def queue_wait_histogram(self, bounds: tuple[float, ...]) -> dict:
        """Cumulative counts of request-to-grant waits <= each bound, their sum and count."""
        cases = ", ".join(f"sum(case when wait <= ? then 1 else 0 end) as b{i}" for i in range(len(bounds)))
        sql = (f"select {cases}, coalesce(sum(wait), 0) as total, count(*) as n from "
               "(select granted_at - requested_at as wait from leases where granted_at is not null)")
        row = next(iter(self.db.query(sql, list(bounds))))
        return {"buckets": [[b, row[f"b{i}"] or 0] for i, b in enumerate(bounds)],
                "sum": row["total"], "count": row["n"]}

    def gpu_hours_since(self, since: float, now: float) -> dict[str, float]:
        totals: dict[str, float] = {}
        for user, gpus, start, end in self.usage_intervals(since, now):
            totals[user] = totals.get(user, 0.0) + gpus * max(0.0, end - start) / 3600.0
        return totals


def _encode(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _decode(row: dict) -> dict:
    row = dict(row)
    for key in ("node_workers", "notice"):
        if row.get(key):
            row[key] = json.loads(row[key])
    row["priority"] = Priority(row["priority"])
    row["over_quota"] = bool(row.get("over_quota"))
    return row


def _quota_row(row: dict) -> QuotaRow:
    quota = Quota(
        max_gpus=row["max_gpus"],
        gpu_hours=row["gpu_hours"],
        max_priority=Priority.parse(row["max_priority"] or "normal"),
    )
    return QuotaRow(row["user"], quota, row["updated_at"], row["updated_by"])
