"""The broker: one named, detached, restartable async Ray actor per cluster.

Glue only: policy decides, the ledger remembers, Ray (rayview) is read once per tick and acted on.
Every method is a coroutine on one event loop and none awaits between reading and writing the
books, so each change is atomic without locks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

from .. import __version__
from ..errors import LeaseNotFound, NotAuthorized
from ..identity import Identity, verify
from . import rayview, reconcile, secrets, settings, views
from .books import Books, Effects, Notice
from .ledger import Ledger
from .model import Placement, Priority

log = logging.getLogger("gpusession.broker")
TICK_S = 0.5


class BrokerService:
    async def __init__(self, config: dict | None = None) -> None:
        self.config = settings.BrokerConfig(**(config or {}))
        self.version_string = self.config.version_override or __version__
        self.db_path = settings.resolve_db_path(self.config)
        self.ledger = Ledger(self.db_path)
        values = settings.resolve(self.config, self.ledger)
        self.policy_values = values
        self.books = Books(self.ledger, settings.policy_settings(values))
        self.timeouts = settings.timeouts(values)
        self.require_signed = bool(values["require_signed_identity"])
        self.revoke_grace_s = float(values["revoke_grace_s"])
        self.admin_token = secrets.admin_token(self.db_path)
        self.identity_key = secrets.identity_key(self.db_path)
        self.ledger_id = self.ledger.setting("ledger_id") or uuid.uuid4().hex[:8]
        self.ledger.set_setting("ledger_id", self.ledger_id)
        self.snapshot = rayview.take(self.ledger_id)
        now = time.time()
        self.last_seen = {lease_id: now for lease_id in self.books.rows}  # callers get time to come back
        self.vanished: dict[int, float] = {}
        self.workers: dict[int, list] = {}
        self.wakers: dict[int, asyncio.Event] = {}
        self._tick()  # a restarted broker reconciles before answering anyone
        self._loop = asyncio.get_running_loop().create_task(self._reconcile_forever())
        log.info("Broker %s started on ledger %s (%d open leases)", self.version_string, self.db_path,
                 len(self.books.rows))

    # ----- callers ------------------------------------------------------------------------------
    async def version(self) -> str:
        return self.version_string

    async def info(self) -> dict:
        return {"version": self.version_string, "db_path": self.db_path, "ledger_id": self.ledger_id,
                "policy": self.policy_values, "pid": os.getpid()}

    async def request(self, spec: dict) -> dict:
        self._check_identity(spec)
        now = time.time()
        fields = {
            "request_id": spec["request_id"], "user": spec["user"], "job_id": spec.get("job_id"),
            "gpus": spec["workers"] * spec["gpus_per_worker"], "workers": spec["workers"],
            "gpus_per_worker": spec["gpus_per_worker"], "min_workers": spec.get("min_workers"),
            "priority": int(Priority.parse(spec.get("priority", "normal"))),
            "placement": Placement.parse(spec.get("placement", "pack")).value,
            "max_hold_s": spec.get("max_hold_s"), "queue_timeout_s": spec.get("queue_timeout_s"),
        }
        lease_id, effects = self.books.add_request(fields, self.snapshot.nodes, now)
        self.last_seen[lease_id] = now
        self._apply(effects)
        self._schedule()
        return self._view(lease_id)

    async def wait(self, lease_id: int, seen_version: int, timeout_s: float = 1.0) -> dict:
        """Long poll: returns when the lease changed since `seen_version`, or after timeout_s.
        Each call is also the queued caller's heartbeat."""
        self.last_seen[lease_id] = time.time()
        if self.books.version(lease_id) == seen_version and lease_id in self.books.rows:
            waker = self.wakers.setdefault(lease_id, asyncio.Event())
            try:
                await asyncio.wait_for(waker.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        self.last_seen[lease_id] = time.time()
        return self._view(lease_id)

    async def watch(self, lease_id: int) -> dict:
        """Returns once the lease gets a notice (preempt, revoke) or ends."""
        while True:
            row = self.books.rows.get(lease_id)
            if row is None or row.get("notice"):
                return self._view(lease_id)
            await self.wakers.setdefault(lease_id, asyncio.Event()).wait()

    async def placed(self, lease_id: int, node_workers: dict, workers: list | None = None) -> dict:
        if workers:
            self.workers[lease_id] = list(workers)
        self._apply(self.books.place(lease_id, node_workers, time.time()))
        return self._view(lease_id)

    async def release(self, lease_id: int, reason: str, released_at: float | None = None) -> dict:
        now = time.time()
        row = self.books.rows.get(lease_id)
        start = (row or {}).get("granted_at") or now
        when = now if released_at is None else min(max(released_at, start), now)
        self.workers.pop(lease_id, None)
        self._apply(self.books.close(lease_id, reason, when))
        self._schedule()
        return self._view(lease_id)

    async def status(self, auth: dict) -> dict:
        user = self._check_identity(auth).user
        now = time.time()
        mine = [self._view(row["id"]) for row in self.books.rows.values() if row["user"] == user]
        return {
            "user": user,
            "cluster": views.cluster_view(self.snapshot, self.books),
            "quota": views.quota_view(user, self.books, self.ledger.quotas(), self._hours_7d(now)),
            "leases": mine,
            "allow_borrowing": self.books.settings.allow_borrowing,
        }

    async def cluster(self) -> dict:
        return views.cluster_view(self.snapshot, self.books)

    # ----- owners and admins ---------------------------------------------------------------------
    async def leases(self, auth: dict, include_ended: bool = False, limit: int = 200) -> list[dict]:
        admin, user = self._who(auth)
        now = time.time()
        if include_ended:
            rows = self.ledger.recent_leases(user=None if admin else user, limit=limit)
        else:
            rows = [r for r in self.books.rows.values() if admin or r["user"] == user]
        return [self._view_of(r, now) for r in rows]

    async def revoke(self, lease_id: int, auth: dict) -> dict:
        admin, user = self._who(auth)
        row = self.books.rows.get(lease_id) or self.ledger.lease(lease_id)
        if row is None:
            raise LeaseNotFound(f"There is no lease {lease_id}. List leases with `gpusession leases`.")
        if not admin and row["user"] != user:
            raise NotAuthorized(f"Lease {lease_id} belongs to {row['user']}; only its owner or an admin may revoke it.")
        by = "admin" if admin else user
        if row["state"] == "queued":
            self._apply(self.books.close(lease_id, "revoked", time.time()))
        elif row["state"] in ("granted", "placed") and not (row.get("notice") or {}).get("kind") == "revoke":
            log.info("Revoking lease %d of %s (by %s)", lease_id, row["user"], by)
            notice = Notice(lease_id, "revoke", f"revoked by {by}", time.time() + self.revoke_grace_s)
            self._apply(self.books.notify(notice))
        self._schedule()
        return self._view(lease_id)

    async def quotas(self, auth: dict) -> list[dict]:
        admin, user = self._who(auth)
        now = time.time()
        rows = self.ledger.quotas()
        recent = self._hours_7d(now)  # users who ran lately appear even without a quota row
        users = sorted(set(rows) | {r["user"] for r in self.books.rows.values()} | set(recent)) if admin else [user]
        return [views.quota_view(u, self.books, rows, recent) for u in users]

    async def quota(self, user: str, auth: dict) -> dict:
        admin, caller = self._who(auth)
        if not admin and user != caller:
            raise NotAuthorized(f"Only an admin may read the quota of {user}; you are {caller}.")
        return views.quota_view(user, self.books, self.ledger.quotas(), self._hours_7d(time.time()))

    async def set_quota(self, user: str, update: dict, auth: dict) -> dict:
        self._require_admin(auth)
        quota = settings.parse_quota_update(update, self.books.quota_for(user))
        self.ledger.set_quota(user, quota, by=auth.get("by") or "admin", now=time.time())
        self.books.reload_quotas()
        log.info("Quota of %s set to %s", user, views.quota_dict(quota))
        self._schedule()
        return views.quota_view(user, self.books, self.ledger.quotas(), self._hours_7d(time.time()))

    async def reset_quota(self, user: str, auth: dict) -> dict:
        self._require_admin(auth)
        self.ledger.reset_quota(user)
        self.books.reload_quotas()
        self._schedule()
        return views.quota_view(user, self.books, self.ledger.quotas(), self._hours_7d(time.time()))

    async def usage(self, auth: dict, since: float | None = None, until: float | None = None,
                    by: str = "user") -> list[dict]:
        admin, user = self._who(auth)
        if by not in ("user", "day"):
            raise ValueError(f"by must be 'user' or 'day'; got {by!r}.")
        until = time.time() if until is None else until
        since = until - 7 * views.DAY_S if since is None else since
        intervals = self.ledger.usage_intervals(since, until, user=None if admin else user)
        return views.usage_report(intervals, by=by)

    async def stats(self, auth: dict, wait_bounds: list[float]) -> dict:
        """Counters over the whole ledger for monitoring (admins): leases by outcome, the
        request-to-grant wait histogram (cumulative, finite bounds), GPU-seconds by user."""
        self._require_admin(auth)
        usage = views.usage_report(self.ledger.usage_intervals(0.0, time.time()), by="user")
        return {"outcomes": self.ledger.outcome_counts(),
                "queue_wait": self.ledger.queue_wait_histogram(tuple(wait_bounds)),
                "gpu_seconds": {row["user"]: row["gpu_seconds"] for row in usage}}

    async def signing_key(self, auth: dict) -> str:
        """The key a Jupyter server signs its kernels' identities with (admins only)."""
        self._require_admin(auth)
        return self.identity_key.decode()

    # ----- internals ---------------------------------------------------------------------------
    def _hours_7d(self, now: float) -> dict[str, float]:
        return self.ledger.gpu_hours_since(now - 7 * views.DAY_S, now)

    def _who(self, auth: dict) -> tuple[bool, str | None]:
        if secrets.token_matches(auth.get("token"), self.admin_token):
            return True, auth.get("user")
        return False, self._check_identity(auth).user

    def _require_admin(self, auth: dict) -> None:
        if not secrets.token_matches(auth.get("token"), self.admin_token):
            raise NotAuthorized("Only admins may do this: it needs the broker's admin token (kept beside its "
                                "ledger on the head node).")

    def _check_identity(self, auth: dict) -> Identity:
        identity = Identity(auth.get("user") or "", auth.get("signature"))
        if not identity.user:
            raise NotAuthorized("The request names no user.")
        if self.require_signed and not verify(identity, self.identity_key):
            raise NotAuthorized(
                f"The identity {identity.user!r} is not signed by the Jupyter server; this cluster requires "
                "signed identities. Start the kernel from the cluster's Jupyter server."
            )
        return identity

    def _view(self, lease_id: int) -> dict:
        row = self.books.recent(lease_id) or self.ledger.lease(lease_id)
        if row is None:
            raise LeaseNotFound(f"There is no lease {lease_id}.")
        return self._view_of(row, time.time())

    def _view_of(self, row: dict, now: float) -> dict:
        view = views.lease_view(row, waiting=self.books.waiting.get(row["id"]),
                                version=self.books.version(row["id"]), now=now)
        view["pg_name"] = rayview.pg_name(self.ledger_id, row["id"])
        return view

    def _schedule(self) -> None:
        self._apply(self.books.schedule(self.snapshot.nodes, time.time()))

    def _apply(self, effects: Effects) -> None:
        for lease_id in effects.changed:
            waker = self.wakers.pop(lease_id, None)
            if waker is not None:
                waker.set()
            if lease_id not in self.books.rows:
                self.last_seen.pop(lease_id, None)
                self.vanished.pop(lease_id, None)

    async def _reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._tick()
            except Exception:  # one bad tick must not stop reconciliation
                log.exception("Reconciliation failed; retrying in %.1f s", TICK_S)

    def _tick(self) -> None:
        self.snapshot = rayview.take(self.ledger_id, self.snapshot)
        now = time.time()
        actions = reconcile.reconcile(
            list(self.books.rows.values()), self.snapshot, now=now, last_seen=self.last_seen,
            vanished_since=self.vanished, timeouts=self.timeouts,
        )
        for action in actions:
            self._carry_out(action, now)
        self._remove_orphan_groups()
        self._schedule()

    def _carry_out(self, action, now: float) -> None:
        if isinstance(action, reconcile.MarkVanished):
            self.vanished[action.lease_id] = action.since
        elif isinstance(action, reconcile.MarkPlaced):
            self._apply(self.books.place(action.lease_id, action.node_workers, now))
        elif isinstance(action, reconcile.Close):
            log.info("Closing lease %d (%s)", action.lease_id, action.reason)
            self._apply(self.books.close(action.lease_id, action.reason, action.released_at))
        elif isinstance(action, reconcile.Force):
            log.info("Forcing lease %d off its GPUs (%s)", action.lease_id, action.reason)
            self._take_back(action.lease_id)
            self._apply(self.books.close(action.lease_id, action.reason, now))

    def _take_back(self, lease_id: int) -> None:
        group = self.snapshot.groups.get(lease_id)
        if group is not None and group.state != "REMOVED":
            rayview.remove_group(group.pg_id)
        rayview.kill_actors(self.workers.pop(lease_id, []))

    def _remove_orphan_groups(self) -> None:
        """A group whose lease is closed (its caller crashed mid-release) must not keep GPUs."""
        for lease_id, group in self.snapshot.groups.items():
            if lease_id not in self.books.rows and group.state in ("CREATED", "PENDING"):
                row = self.ledger.lease(lease_id)
                if row is not None and row["state"] == "ended":
                    log.info("Removing the orphaned group of closed lease %d", lease_id)
                    rayview.remove_group(group.pg_id)
