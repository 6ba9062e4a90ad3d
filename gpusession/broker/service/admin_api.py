"""The broker's methods for owners and admins (quotas, usage, monitoring, upgrades): a mixin of
BrokerService, kept apart so each file has one job. Reads run on the journal's reader threads."""
from __future__ import annotations

import logging
import time

from ...errors import InvalidRequest, NotAuthorized
from . import authz, settings, views
from ..protocol import request as checks
from .door import door

log = logging.getLogger("gpusession.broker")
STATS_CACHE_S = 5.0  # monitoring scrapes every few seconds must not re-read the whole ledger each time


def books_week() -> float:
    return 7 * views.DAY_S


class AdminMethods:
    @door
    async def quotas(self, auth: dict) -> list[dict]:
        who = authz.caller(auth, self.keys)
        rows, recent = await self.journal.read("quotas"), await self._hours_7d()
        users = [who.user]
        if who.admin:  # users who ran lately appear even without a quota row
            users = sorted(set(rows) | {r["user"] for r in self.books.rows.values()} | set(recent))
        return [views.quota_view(u, self.books, rows, recent) for u in users]

    @door
    async def quota(self, user: str, auth: dict) -> dict:
        who = authz.caller(auth, self.keys)
        user = checks.text(user, "user", checks._NAME, "a user name of 1-256 printable characters")
        if not who.admin and user != who.user:
            raise NotAuthorized(f"Only an admin may read the quota of {user}; you are {who.user}.")
        return views.quota_view(user, self.books, await self.journal.read("quotas"), await self._hours_7d())

    @door
    async def set_quota(self, user: str, update: dict, auth: dict) -> dict:
        self._require_admin(auth)
        user = checks.text(user, "user", checks._NAME, "a user name of 1-256 printable characters")
        quota = settings.parse_quota_update(update, self.books.quota_for(user))
        by = auth.get("by") if isinstance(auth.get("by"), str) else "admin"
        self.journal.set_quota(user, quota, by=by[:256], now=time.time())
        self.books.set_quota(user, quota)
        log.info("Quota of %s set to %s", user, views.quota_dict(quota))
        self._schedule()
        return await self.quota(user, auth)

    @door
    async def reset_quota(self, user: str, auth: dict) -> dict:
        self._require_admin(auth)
        user = checks.text(user, "user", checks._NAME, "a user name of 1-256 printable characters")
        self.journal.reset_quota(user)
        self.books.set_quota(user, None)
        self._schedule()
        return await self.quota(user, auth)

    @door
    async def usage(self, auth: dict, since: float | None = None, until: float | None = None,
                    by: str = "user") -> list[dict]:
        """GPU-seconds per user (or per user and day) in [since, until], computed in SQL on a reader
        thread over the part of the range the ledger has data for."""
        who = authz.caller(auth, self.keys)
        by = checks.grouping(by)
        earliest = await self.journal.read("earliest_grant")
        since, until = checks.usage_range(since, until, now=time.time(), earliest=earliest)
        user = None if who.admin else who.user
        return await self.journal.read("usage_by_user" if by == "user" else "usage_by_day", since, until, user)

    @door
    async def stats(self, auth: dict, wait_bounds: list[float]) -> dict:
        """Counters over the whole ledger for monitoring (admins), cached STATS_CACHE_S: leases by
        outcome, the request-to-grant wait histogram (cumulative, finite bounds), GPU-seconds by user."""
        self._require_admin(auth)
        if not isinstance(wait_bounds, (list, tuple)) or not 0 < len(wait_bounds) <= 64:
            raise InvalidRequest("wait_bounds must be a list of 1-64 numbers of seconds.")
        bounds = tuple(checks.number(b, "wait_bounds", low=0.0, high=1e9) for b in wait_bounds)
        now = time.time()
        if self._stats is not None and self._stats[1] == bounds and now - self._stats[0] < STATS_CACHE_S:
            return self._stats[2]
        usage = await self.journal.read("usage_by_user", 0.0, now)
        result = {"outcomes": await self.journal.read("outcome_counts"),
                  "queue_wait": await self.journal.read("queue_wait_histogram", bounds),
                  "gpu_seconds": {row["user"]: row["gpu_seconds"] for row in usage}}
        self._stats = (now, bounds, result)
        return result

    @door
    async def timings(self, auth: dict, reset: bool = False) -> dict:
        """How fast the broker answers (admins): request handling, scheduling decisions, loop lag;
        `reset` starts a new measurement (benchmarks)."""
        self._require_admin(auth)
        summary = self.meter.summary()
        if reset is True:
            self.meter.reset()
        return summary

    @door
    async def signing_key(self, auth: dict) -> str:
        """The key a Jupyter server signs its kernels' identities with (admins only)."""
        self._require_admin(auth)
        return self.keys.identity_key.decode()

    @door
    async def retire(self, auth: dict) -> dict:
        """Before an admin's client replaces this broker with a newer one: check the token, commit
        every write, and say where the ledger is (the new broker opens the same one)."""
        self._require_admin(auth)
        await self.journal.flushed()
        log.info("Retiring broker %s for an upgrade by %s", self.version_string, auth.get("user") or "admin")
        return {"db_path": self.db_path}

