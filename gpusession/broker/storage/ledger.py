"""The broker's books in SQLite (through sqlite-utils): leases, quotas, settings, usage.

Every state change is one transaction, so a broker that crashes between two calls loses
nothing and counts nothing twice. Schema changes are registered migrations, applied in order.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import sqlite_utils

from ..policy.model import Placement, Priority, Quota
from ..policy.states import ACTIVE_STATES, OPEN_STATES, LeaseState, sources

log = logging.getLogger("gpusession.broker")
__all__ = ["ACTIVE_STATES", "OPEN_STATES", "Ledger", "MIGRATIONS", "QuotaRow"]
LEASE_COLUMNS = (
    "id request_id user job_id gpus workers gpus_per_worker min_workers priority placement "
    "max_hold_s queue_timeout_s state over_quota requested_at granted_at placed_at released_at "
    "end_reason gpu_seconds node_workers notice preempted_for sweep_id gpu_ids full_workers sized_at "
    "gpu_seconds_before notebook cell_id background"
).split()
NUMBER_COLUMNS = ("gpus", "gpus_per_worker", "max_hold_s", "queue_timeout_s", "requested_at", "granted_at",
                  "placed_at", "released_at", "gpu_seconds", "sized_at", "gpu_seconds_before")

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


@migration
def m002_sweep_id(db: sqlite_utils.Database) -> None:
    """Trials of one sweep share a sweep id (None for a lease outside any sweep)."""
    db.execute("alter table leases add column sweep_id text")


# Infinity is written 9e999 in SQLite; NaN is stored as NULL, so NULL checks catch it too.
_BAD_NUMBERS = " or ".join(
    [f"abs(coalesce(new.{c}, 0)) >= 9e999" for c in NUMBER_COLUMNS]
    + ["new.workers is null", "new.workers < 1", "new.gpus_per_worker is null", "new.gpus_per_worker < 0.01",
       "new.gpus <= 0",
       "(new.state = 'ended' and new.granted_at is not null and "
       "(new.released_at is null or new.released_at < new.granted_at))"]
)


@migration
def m003_refuse_bad_numbers(db: sqlite_utils.Database) -> None:
    """The schema itself refuses a lease row with a non-finite or impossible number."""
    for event in ("insert", "update"):
        db.execute(
            f"create trigger leases_numbers_{event} before {event} on leases when {_BAD_NUMBERS} begin "
            "select raise(abort, 'lease row refused: a number is missing, not finite or out of range'); end"
        )


@migration
def m004_quarantine(db: sqlite_utils.Database) -> None:
    """Rows a restarted broker could not read are moved here, with the reason, instead of failing it."""
    db.execute("create table quarantined_leases (id integer primary key, reason text not null, "
               "row text not null, quarantined_at real not null)")


@migration
def m005_gpu_ids(db: sqlite_utils.Database) -> None:
    """The GPU ids a placed lease's workers hold, per node (JSON: node id -> one list per worker)."""
    db.execute("alter table leases add column gpu_ids text")


@migration
def m006_elastic_sizes(db: sqlite_utils.Database) -> None:
    """Elastic leases change size: the size asked for (full_workers), when the current size began
    (sized_at; NULL: at the grant), the GPU-seconds of earlier sizes, and each earlier size as an
    interval of its own (lease_sizes) for usage reports."""
    db.execute("alter table leases add column full_workers integer")
    db.execute("alter table leases add column sized_at real")
    db.execute("alter table leases add column gpu_seconds_before real")
    db.execute("create table lease_sizes (lease_id integer not null, user text not null, gpus real not null, "
               "start real not null, end real not null)")
    db.execute("create index lease_sizes_user_end on lease_sizes (user, end)")


@migration
def m007_notebook(db: sqlite_utils.Database) -> None:
    """The notebook and cell a lease was asked from (NULL: not from a Jupyter server's kernel)."""
    db.execute("alter table leases add column notebook text")
    db.execute("alter table leases add column cell_id text")


@migration
def m008_background(db: sqlite_utils.Database) -> None:
    """Whether a background run asked for the lease (0 for every lease asked before)."""
    db.execute("alter table leases add column background integer not null default 0")


@dataclass(frozen=True)
class QuotaRow:
    user: str
    quota: Quota
    updated_at: float | None
    updated_by: str | None


class Ledger:
    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One thread at a time uses a connection (the broker's writer thread, or one reader),
        # but not always the thread that opened it.
        self.db = sqlite_utils.Database(sqlite3.connect(str(self.path), check_same_thread=False))
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self._batching = False
        if migrate:
            self.migrate()

    @contextlib.contextmanager
    def _tx(self):
        """One write: its own transaction, or (inside `batch`) a savepoint of the batch's."""
        if not self._batching:
            with self.db.conn:
                yield
            return
        self.db.conn.execute("savepoint one_write")
        try:
            yield
        except BaseException:
            self.db.conn.execute("rollback to one_write")
            raise
        finally:
            self.db.conn.execute("release one_write")

    @contextlib.contextmanager
    def batch(self):
        """Group commit: the writes in here commit together, each still all-or-nothing (a failed
        one rolls back to its savepoint and raises; the others stay)."""
        self.db.conn.commit()
        self.db.conn.execute("begin immediate")
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self.db.conn.commit()

    def migrate(self) -> list[str]:
        """Apply the registered migrations not applied yet, each in its own transaction: one that
        fails leaves the database as it was before it, and the error names it."""
        conn = self.db.conn
        conn.commit()
        conn.execute("create table if not exists _migrations (name text primary key, applied_at float)")
        conn.commit()
        done = {row[0] for row in conn.execute("select name from _migrations")}
        applied = []
        for name, fn in MIGRATIONS:
            if name in done:
                continue
            conn.execute("begin immediate")
            try:
                fn(self.db)
                conn.execute("insert into _migrations (name, applied_at) values (?, ?)", [name, time.time()])
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            applied.append(name)
        return applied

    # ----- leases -------------------------------------------------------------------------
    def add_lease(self, row: dict[str, Any]) -> int:
        """Insert a request row (with the id the books gave it, or a new one) and return its id."""
        columns = [c for c in LEASE_COLUMNS if c in row and (c != "id" or row[c] is not None)]
        values = [int(row[c]) if c in ("priority", "over_quota") else _encode(row[c]) for c in columns]
        sql = f"insert into leases ({', '.join(columns)}) values ({', '.join('?' for _ in columns)})"
        with self._tx():
            return self.db.conn.execute(sql, values).lastrowid

    def lease_by_request_id(self, request_id: str) -> dict | None:
        rows = list(self.db.query("select * from leases where request_id = ?", [request_id]))
        return _decode(rows[0]) if rows else None

    def request_ids_since(self, since: float) -> dict[str, int]:
        """request id -> lease id of requests made since `since` (a restarted broker's memory of
        what callers may still retry)."""
        sql = "select request_id, id from leases where requested_at >= ? and request_id is not null"
        return dict(self.db.conn.execute(sql, [since]).fetchall())

    def lease(self, lease_id: int) -> dict | None:
        rows = list(self.db.query("select * from leases where id = ?", [lease_id]))
        return _decode(rows[0]) if rows else None

    def open_leases(self) -> list[dict]:
        """Open rows, readable ones only: a row the broker cannot use (a number out of range,
        broken JSON, an unknown state) is quarantined with a log line, so a restart never fails."""
        marks = ",".join("?" for _ in OPEN_STATES)
        sql = f"select * from leases where state in ({marks}) order by id"
        good = []
        for raw in list(self.db.query(sql, OPEN_STATES)):
            problem = row_problem(raw)
            row = None
            if problem is None:
                try:
                    row = _decode(raw)
                except (ValueError, TypeError, KeyError) as exc:
                    problem = f"unreadable ({exc})"
            if problem is None:
                good.append(row)
            else:
                self.quarantine(raw, problem)
        return good

    def quarantine(self, raw: dict, reason: str) -> None:
        log.error("Quarantined lease %s of %s: %s (moved to table quarantined_leases)", raw.get("id"),
                  raw.get("user"), reason)
        with self.db.conn:
            self.db.conn.execute("insert or replace into quarantined_leases (id, reason, row, quarantined_at) "
                                 "values (?, ?, ?, ?)", [raw["id"], reason, json.dumps(raw, default=repr), time.time()])
            self.db.conn.execute("delete from leases where id = ?", [raw["id"]])

    def quarantined(self) -> list[dict]:
        return list(self.db.query("select id, reason, row from quarantined_leases order by id"))

    def max_id(self) -> int:
        row = self.db.conn.execute("select max(id) from (select max(id) as id from leases "
                                   "union all select max(id) from quarantined_leases)").fetchone()
        return int(row[0] or 0)

    def recent_leases(self, *, user: str | None = None, limit: int = 200) -> list[dict]:
        where, args = ("where user = ?", [user]) if user else ("", [])
        sql = f"select * from leases {where} order by id desc limit ?"
        return [_decode(r) for r in self.db.query(sql, args + [limit])]

    def grant(self, grants: Iterable[tuple[int, bool]], now: float) -> None:
        with self._tx():
            self.db.conn.executemany(
                f"update leases set state='granted', granted_at=?, over_quota=? where id=? and {_from(LeaseState.GRANTED)}",
                [(now, int(over), lease_id) for lease_id, over in grants],
            )

    def place(self, lease_id: int, node_workers: dict[str, int], now: float) -> None:
        with self._tx():
            self.db.execute(
                "update leases set state='placed', placed_at=?, node_workers=? "
                f"where id=? and {_from(LeaseState.PLACED)}",
                [now, json.dumps(node_workers), lease_id],
            )

    def set_gpu_ids(self, lease_id: int, gpu_ids: dict[str, list[list[str]]]) -> None:
        with self._tx():
            self.db.execute(f"update leases set gpu_ids=? where id=? and state in {ACTIVE_STATES!r}",
                            [json.dumps(gpu_ids), lease_id])

    def set_notice(self, lease_id: int, notice: dict, preempted_for: int | None) -> None:
        with self._tx():
            self.db.execute(
                "update leases set notice=?, preempted_for=? where id=?",
                [json.dumps(notice), preempted_for, lease_id],
            )

    def resize(self, lease_id: int, workers: int, gpus: float, node_workers: dict[str, int], sized_at: float,
               gpu_seconds_before: float | None, segment: tuple[str, float, float, float] | None) -> None:
        """An open lease changed size (or, segment None, only where its workers are): the earlier
        size becomes an interval of its own, and the notice that asked for it is cleared."""
        with self._tx():
            if segment is not None:
                self.db.conn.execute("insert into lease_sizes (lease_id, user, gpus, start, end) values (?, ?, ?, ?, ?)",
                                     [lease_id, *segment])
            self.db.conn.execute(
                "update leases set workers=?, gpus=?, node_workers=?, sized_at=?, gpu_seconds_before=?, notice=NULL, "
                "preempted_for=NULL where id=? and state in ('granted', 'placed')",
                [workers, gpus, json.dumps(node_workers), sized_at, gpu_seconds_before, lease_id],
            )

    def close(self, lease_id: int, reason: str, released_at: float, gpu_seconds: float) -> bool:
        """End a lease exactly once (the books computed its figures); False if it had already
        ended: the state check in the UPDATE makes a second close change nothing."""
        with self._tx():
            cursor = self.db.conn.execute(
                f"update leases set state='ended', end_reason=?, released_at=?, gpu_seconds=? "
                f"where id=? and {_from(LeaseState.ENDED)}",
                [reason, released_at, gpu_seconds, lease_id],
            )
        return cursor.rowcount > 0

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
    # Computed in SQL over a range the caller bounded (request.usage_range): a query costs what
    # the ledger holds in that range, and runs on a reader thread, never on the broker's loop.
    # An elastic lease counts its current size from sized_at, its earlier sizes from lease_sizes.
    _INTERVALS = (
        "select user, gpus, max(coalesce(sized_at, granted_at), :since) as s, "
        "min(coalesce(released_at, :until), :until) as e "
        "from leases where granted_at is not null and placed_at is not null "
        "and coalesce(sized_at, granted_at) < :until "
        "and (released_at is null or released_at > :since) and (:user is null or user = :user) "
        "union all select user, gpus, max(start, :since) as s, min(end, :until) as e from lease_sizes "
        "where start < :until and end > :since and (:user is null or user = :user)"
    )

    def earliest_grant(self) -> float | None:
        return self.db.conn.execute("select min(granted_at) from leases").fetchone()[0]

    def usage_by_user(self, since: float, until: float, user: str | None = None) -> list[dict]:
        sql = (f"select user, sum(gpus * (e - s)) as gpu_seconds from ({self._INTERVALS}) "
               "where e > s group by user order by user")
        args = {"since": since, "until": until, "user": user}
        return [{"user": r["user"], "gpu_seconds": round(r["gpu_seconds"], 3)} for r in self.db.query(sql, args)]

    def usage_by_day(self, since: float, until: float, user: str | None = None) -> list[dict]:
        """GPU-seconds per user and UTC day: each interval is cut at midnights by a recursive query."""
        sql = (
            f"with recursive piece(user, gpus, s, e) as (select * from ({self._INTERVALS}) where e > s "
            "union all select user, gpus, (cast(s / 86400 as integer) + 1) * 86400.0, e from piece "
            "where (cast(s / 86400 as integer) + 1) * 86400.0 < e) "
            "select user, cast(s / 86400 as integer) as day, "
            "sum(gpus * (min(e, (cast(s / 86400 as integer) + 1) * 86400.0) - s)) as gpu_seconds "
            "from piece group by user, day order by user, day"
        )
        args = {"since": since, "until": until, "user": user}
        return [{"user": r["user"], "day": _day(r["day"]), "gpu_seconds": round(r["gpu_seconds"], 3)}
                for r in self.db.query(sql, args)]

    def usage_intervals(self, since: float, until: float, user: str | None = None) -> list[tuple]:
        """(user, gpus, start, end) of every granted lease overlapping [since, until]."""
        args = {"since": since, "until": until, "user": user}
        return [(r["user"], r["gpus"], r["s"], r["e"]) for r in self.db.query(self._INTERVALS, args)]

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
        return {r["user"]: r["gpu_seconds"] / 3600.0 for r in self.usage_by_user(since, now)}


def _from(new: LeaseState) -> str:
    """SQL: the row is in a state that may move to `new` (states.TRANSITIONS)."""
    return "state in (" + ", ".join(f"'{state}'" for state in sources(new)) + ")"


def _day(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86400))


def row_problem(raw: dict) -> str | None:
    """Why the broker cannot use this stored row, or None. The same bounds as a new request."""
    from ..protocol.request import MAX_WORKERS, MIN_GPUS_PER_WORKER

    try:
        LeaseState(raw.get("state"))
    except ValueError:
        return f"unknown state {raw.get('state')!r}"
    for column in NUMBER_COLUMNS:
        value = raw.get(column)
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
            return f"{column}={value!r} is not a finite number"
    workers, gpw = raw.get("workers"), raw.get("gpus_per_worker")
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        return f"workers={workers!r} is not a whole number from 1 to {MAX_WORKERS}"
    if not isinstance(gpw, (int, float)) or gpw < MIN_GPUS_PER_WORKER:
        return f"gpus_per_worker={gpw!r} is below {MIN_GPUS_PER_WORKER}"
    if raw.get("priority") not in tuple(int(p) for p in Priority):
        return f"priority={raw.get('priority')!r} is not a known priority"
    if raw.get("placement") not in tuple(p.value for p in Placement):
        return f"placement={raw.get('placement')!r} is not a known placement"
    if raw.get("requested_at") is None:
        return "it has no requested_at"
    return None


def _encode(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _decode(row: dict) -> dict:
    row = dict(row)
    row["state"] = LeaseState(row["state"])
    for key in ("node_workers", "notice", "gpu_ids"):
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
