"""The broker: one named, detached, restartable async Ray actor per cluster.

Glue only: policy decides, the ledger remembers, Ray (rayview) is read once per tick and acted on.
Every method is a coroutine on one event loop. Nothing slow runs on that loop: Ray's state is
read, groups are removed and SQLite is written and read on threads (journal.py), so a ten-year
usage report never delays anyone's grant. Changes to the books still happen with no await
between reading and writing them, so each is atomic without locks.

Every reply waits for its change to be committed, so no restart can take back what a caller was
told, and a release is billed to the moment it was made, never to when a restarted broker
noticed. (Not waiting on `release` and `placed` was tried: it made no measurable difference to
throughput here, see docs/speed.md, and would bill a release lost in a crash until the restart.)

Every value a caller sends is checked at the door (request.py) and every method that names a
lease checks its caller (authz.py). Unexpected failures reach callers as BrokerFailed, with no
paths or secrets in the message; the broker's log has the details.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid

from ..._version import __version__
from ...errors import InvalidRequest, LeaseNotFound, NotAuthorized
from . import authz, rayview, reconcile, settings, views
from ..policy import gpuids
from ..protocol import request as checks
from ..storage import secrets, statedir
from ..http import status_http
from .admin_api import AdminMethods, books_week
from ..storage.books import Books, Effects, Notice, NoticeKind
from .door import door
from ..storage.journal import Journal
from ..storage.ledger import Ledger
from ..protocol.request import PROTOCOL, LeaseRequest
from .relocate_api import RelocateMethods
from .progress_api import ProgressMethods
from .resize_api import ResizeMethods
from ..policy.states import LeaseState
from ...cluster.placement import PlacementState
from .timings import Timings

log = logging.getLogger("gpusession.broker")
TICK_S = 0.5
SWITCH_INTERVAL_S = 0.0005


class BrokerService(AdminMethods, ResizeMethods, RelocateMethods, ProgressMethods):
    async def __init__(self, config: dict | None = None) -> None:
        # The ledger's writer and readers are threads: let one that has waited for the GIL get it
        # within 0.5 ms (Python's default is 5 ms), or every reply waits that long for its commit.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.config = settings.BrokerConfig(**(config or {}))
        self.steps = {}  # lease id -> its run's live step (progress_api)
        self.version_string = self.config.version_override or __version__
        self.db_path = settings.explicit_db_path(self.config)
        self.state_claim = None  # held while this broker runs: no other cluster's broker takes its directory
        if self.db_path is not None:  # so a broker started later with defaults opens this ledger too
            self.db_path = await asyncio.to_thread(statedir.record_explicit_ledger, self.db_path)
        else:
            self.db_path = await asyncio.to_thread(statedir.recorded_explicit_ledger)
        if self.db_path is None:
            self.state_claim = await asyncio.to_thread(statedir.claim_for_this_cluster)
            self.db_path = self.state_claim.db_path
        ledger = Ledger(self.db_path)
        values = settings.resolve(self.config, ledger)
        self.policy_values = values
        self.journal = Journal(ledger)
        self.books = Books(ledger, settings.policy_settings(values), journal=self.journal)
        self.timeouts = settings.timeouts(values)
        self.revoke_grace_s = float(values["revoke_grace_s"])
        self.keys = authz.Keys(secrets.admin_token(self.db_path), secrets.identity_key(self.db_path),
                               bool(values["require_signed_identity"]))
        self.ledger_id = ledger.setting("ledger_id") or uuid.uuid4().hex[:8]
        ledger.set_setting("ledger_id", self.ledger_id)
        now = time.time()
        self.books.set_usage(now, ledger.gpu_hours_since(now - books_week(), now))
        self.snapshot = await asyncio.to_thread(rayview.take, self.ledger_id)
        self.last_seen = {lease_id: now for lease_id in self.books.rows}  # callers get time to come back
        self.vanished: dict[int, float] = {}
        self.reported_lost: dict[str, float] = {}  # node id -> when a run reported it lost (relocate)
        self.workers: dict[int, list] = {}
        self.wakers: dict[int, asyncio.Event] = {}
        self.meter = Timings()
        self._stats: tuple[float, tuple, dict] | None = None
        await self._tick()  # a restarted broker reconciles before answering anyone
        self.status_endpoint = await status_http.open_or_none(self.status, db_path=self.db_path,
                                                              ray_address=rayview.gcs_address())
        self._tasks = [asyncio.get_running_loop().create_task(self._reconcile_forever()),
                       asyncio.get_running_loop().create_task(self.meter.watch_loop())]
        log.info("Broker %s started on ledger %s (%d open leases)", self.version_string, self.db_path,
                 len(self.books.rows))

    # ----- anyone ----------------------------------------------------------------------------------
    @door
    async def version(self) -> str:
        return self.version_string

    @door
    async def info(self, auth: dict | None = None) -> dict:
        """Version, protocol, policy. Where the ledger lives only for an admin."""
        out = {"version": self.version_string, "protocol": self.config.protocol_override or PROTOCOL, "ledger_id": self.ledger_id,
               "policy": self.policy_values, "pid": os.getpid()}
        if auth is not None and authz.caller(auth, self.keys).admin:
            out["db_path"] = self.db_path
        return out

    @door
    async def cluster(self) -> dict:
        return views.cluster_view(self.snapshot, self.books)

    # ----- a kernel and its lease --------------------------------------------------------------------
    @door
    async def request(self, spec: dict) -> dict:
        started = time.perf_counter()
        req = LeaseRequest.parse(spec)
        req.check_fits(self.snapshot.nodes)
        authz.caller({"user": req.user, "signature": req.signature, "job_id": req.job_id}, self.keys)
        lease_id = self.books.find_request(req.request_id)  # a retry (also after a restart) finds its lease
        if lease_id is None:
            if self.books.quota_for(req.user).gpu_hours is not None and self.books.usage_stale(time.time()):
                await self._refresh_usage()
            lease_id = self._add(req)
        await self._committed()
        if lease_id in self.books.rows:  # its caller is alive: it waits for this reply
            self.last_seen[lease_id] = time.time()
        self.meter.add("request", time.perf_counter() - started)
        return self._view_of(await self._row(lease_id), time.time())

    def _add(self, req: LeaseRequest) -> int:
        """No await in here: the check for a duplicate and the insert are one step."""
        known = self.books.find_request(req.request_id)
        if known is not None:
            return known
        fields = {
            "request_id": req.request_id, "user": req.user, "job_id": req.job_id, "gpus": req.gpus,
            "workers": req.workers, "gpus_per_worker": req.gpus_per_worker, "min_workers": req.min_workers,
            "priority": int(req.priority), "placement": req.placement.value, "max_hold_s": req.max_hold_s,
            "queue_timeout_s": req.queue_timeout_s, "sweep_id": req.sweep_id,
            "notebook": req.notebook, "cell_id": req.cell_id, "background": int(req.background),
        }
        now = time.time()
        lease_id, effects = self.books.add_request(fields, self.snapshot.nodes_for(self.books.active()), now)
        self.last_seen[lease_id] = now
        self._apply(effects)
        self._schedule()
        return lease_id

    @door
    async def wait(self, lease_id: int, seen_version: int, timeout_s: float = 1.0, *, auth: dict) -> dict:
        """Long poll: returns when the lease changed since `seen_version`, or after timeout_s.
        Each call is also the queued caller's heartbeat."""
        seen_version = checks.whole(seen_version, "seen_version", low=-1, high=2**62)
        timeout_s = checks.poll_seconds(timeout_s)
        await self._owned(lease_id, auth, "wait on")
        self.last_seen[lease_id] = time.time()
        if self.books.version(lease_id) == seen_version and lease_id in self.books.rows:
            waker = self.wakers.setdefault(lease_id, asyncio.Event())
            try:
                await asyncio.wait_for(waker.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        self.last_seen[lease_id] = time.time()
        await self._committed()  # a grant this reply shows must survive a restart
        return self._view_of(await self._row(lease_id), time.time())

    @door
    async def watch(self, lease_id: int, *, auth: dict, seen: str | None = None) -> dict:
        """Returns once the lease gets a notice (preempt, revoke, shrink, an offer to grow) other
        than the one whose id is `seen`, or ends."""
        if seen is not None and (not isinstance(seen, str) or len(seen) > 64):
            raise InvalidRequest(f"seen must be a notice id (a short string) or None; got {type(seen).__name__}. "
                                 "Nothing was changed.")
        await self._owned(lease_id, auth, "watch")
        while True:
            row = self.books.rows.get(lease_id)
            if row is None or (row.get("notice") and row["notice"].get("id") != seen):
                await self._committed()  # the notice it shows must survive a restart
                return self._view_of(await self._row(lease_id), time.time())
            await self.wakers.setdefault(lease_id, asyncio.Event()).wait()

    @door
    async def placed(self, lease_id: int, node_workers: dict, workers: list | None = None, *,
                     gpu_ids: dict | None = None, auth: dict) -> dict:
        """The caller's group is placed (`node_workers`: workers per node; `gpu_ids`: per node, the
        GPU ids of each worker there), and/or these are its worker actors (the broker kills them
        if it must take the lease back)."""
        row = await self._owned(lease_id, auth, "report the placement of")
        if workers is not None and (not isinstance(workers, list) or len(workers) > row["workers"]):
            raise InvalidRequest(f"workers must be a list of at most {row['workers']} worker actors (lease "
                                 f"{lease_id} has {row['workers']}). Nothing was changed.")
        if gpu_ids is not None and not node_workers:
            raise InvalidRequest("gpu_ids must come with node_workers (the workers per node they belong to). "
                                 "Nothing was changed.")
        if node_workers:
            node_workers = self._check_placement(row, node_workers)
        if gpu_ids is not None:
            gpu_ids = await self._check_gpu_ids(row, node_workers, gpu_ids)
        if row["state"] == LeaseState.ENDED:
            return self._view_of(row, time.time())
        if workers:
            self.workers[lease_id] = list(workers)
        if node_workers:
            self._apply(self.books.place(lease_id, node_workers, time.time()))
        if gpu_ids is not None:
            self._apply(self.books.record_gpu_ids(lease_id, gpu_ids))
        await self._committed()
        return self._view_of(await self._row(lease_id), time.time())

    def _check_placement(self, row: dict, node_workers) -> dict[str, int]:
        """Per-node worker counts must add up to the grant and name nodes Ray has (and, once Ray
        shows the lease's group, be where Ray put it)."""
        counts = checks.node_workers(node_workers, workers=row["workers"])
        known = {node.node_id for node in self.snapshot.nodes}
        strangers = sorted(set(counts) - known)
        if known and strangers:
            raise InvalidRequest(f"node_workers names node {strangers[0][:16]}..., which has no GPUs in this "
                                 "cluster. Nothing was changed.")
        group = self.snapshot.groups.get(row["id"])
        if group is not None and group.state == PlacementState.CREATED and group.node_workers != counts:
            raise InvalidRequest(f"node_workers {counts} differs from where Ray placed lease {row['id']} "
                                 f"({group.node_workers}). Nothing was changed.")
        return counts

    async def _check_gpu_ids(self, row: dict, node_workers: dict[str, int], gpu_ids) -> dict:
        """Each worker's GPU ids: as many as its share needs, on GPUs its node has room for, none
        held by another live lease.

        Ray, not the books, decides which GPU a bundle gets: when another lease's group is gone,
        Ray may hand its GPUs on before that lease's release reaches the broker (another process),
        or before a restarted broker has reconciled a lease that ended while it was away. So a
        clash with the books is checked against Ray's placement groups once more (off the loop);
        the records of leases Ray no longer places are dropped, and only a clash with a lease Ray
        still places is refused."""
        parsed = gpuids.parse(gpu_ids, node_workers=node_workers, gpus_per_worker=row["gpus_per_worker"])
        holders = [gpuids.Holder(*held) for held in self.books.gpu_id_holders()]
        try:
            self._check_room(row, parsed, holders)
            return parsed
        except InvalidRequest:
            if not any(holder.lease_id != row["id"] for holder in holders):
                raise
        placed_now = await asyncio.to_thread(rayview.placed_leases, self.ledger_id)
        stale = [h for h in holders if h.lease_id != row["id"] and h.lease_id not in placed_now]
        live = [h for h in holders if h.lease_id == row["id"] or h.lease_id in placed_now]
        self._check_room(row, parsed, live)  # a clash with a lease Ray still places is refused here
        for holder in stale:
            log.info("Lease %d's GPU ids are out of date (Ray no longer places its group): dropped for lease %d's",
                     holder.lease_id, row["id"])
            self._apply(self.books.record_gpu_ids(holder.lease_id, {}))
        return parsed

    def _check_room(self, row: dict, parsed: dict, holders: list) -> None:
        gpuids.check_room(row["id"], parsed, gpus_per_worker=row["gpus_per_worker"],
                          node_gpus={node.node_id: node.gpus for node in self.snapshot.nodes}, others=holders)

    @door
    async def release(self, lease_id: int, reason: str, *, auth: dict) -> dict:
        """Close the lease now, by the broker's clock (a caller's clock never decides GPU-seconds)."""
        reason = checks.release_reason(reason)
        await self._owned(lease_id, auth, "release")
        started = time.perf_counter()
        self.workers.pop(lease_id, None)
        self._apply(self.books.close(lease_id, reason, time.time()))
        self._schedule()
        await self._committed()
        self.meter.add("release", time.perf_counter() - started)
        return self._view_of(await self._row(lease_id), time.time())

    @door
    async def status(self, auth: dict) -> dict:
        user = authz.caller(auth, self.keys).user
        mine = [self._view_of(row, time.time()) for row in self.books.rows.values() if row["user"] == user]
        return {
            "user": user,
            "cluster": views.cluster_view(self.snapshot, self.books),
            "quota": views.quota_view(user, self.books, await self.journal.read("quotas"), await self._hours_7d()),
            "leases": mine,
            "allow_borrowing": self.books.settings.allow_borrowing,
        }

    # ----- owners and admins ---------------------------------------------------------------------
    @door
    async def leases(self, auth: dict, include_ended: bool = False, limit: int = 200) -> list[dict]:
        who = authz.caller(auth, self.keys)
        limit = checks.whole(limit, "limit", low=1, high=1_000_000)
        if include_ended:
            rows = await self.journal.read("recent_leases", user=None if who.admin else who.user, limit=limit)
        else:
            rows = [r for r in self.books.rows.values() if who.admin or r["user"] == who.user]
        now = time.time()
        return [self._view_of(self.books.recent(r["id"]) or r, now) for r in rows]

    @door
    async def revoke(self, lease_id: int, auth: dict) -> dict:
        who = authz.caller(auth, self.keys)
        row = await self._row(checks.lease_id(lease_id))
        if not who.admin and row["user"] != who.user:
            raise NotAuthorized(f"Lease {lease_id} belongs to {row['user']}; only its owner or an admin may revoke it.")
        by = "admin" if who.admin else who.user
        if row["state"] == LeaseState.QUEUED:
            self._apply(self.books.close(lease_id, "revoked", time.time()))
        elif row["state"] in (LeaseState.GRANTED, LeaseState.PLACED) and (row.get("notice") or {}).get("kind") != NoticeKind.REVOKE:
            log.info("Revoking lease %d of %s (by %s)", lease_id, row["user"], by)
            notice = Notice(lease_id, NoticeKind.REVOKE, f"revoked by {by}", time.time() + self.revoke_grace_s)
            self._apply(self.books.notify(notice))
        self._schedule()
        await self._committed()
        return self._view_of(await self._row(lease_id), time.time())

    # ----- internals ---------------------------------------------------------------------------
    async def _committed(self) -> None:
        """Wait until this call's changes are in the ledger (the reply promises they are)."""
        started = time.perf_counter()
        await self.journal.flushed()
        self.meter.add("commit_wait", time.perf_counter() - started)

    async def _hours_7d(self) -> dict[str, float]:
        now = time.time()
        return await self.journal.read("gpu_hours_since", now - books_week(), now)

    async def _refresh_usage(self) -> None:
        now = time.time()
        self.books.set_usage(now, await self.journal.read("gpu_hours_since", now - books_week(), now))

    def _require_admin(self, auth: dict) -> None:
        if not (isinstance(auth, dict) and secrets.token_matches(auth.get("token"), self.keys.admin_token)):
            raise NotAuthorized("Only admins may do this: it needs the broker's admin token (kept beside its "
                                "ledger on the head node).")

    async def _row(self, lease_id: int) -> dict:
        row = self.books.recent(lease_id)
        if row is None:
            row = await self.journal.read("lease", lease_id)
        if row is None:
            raise LeaseNotFound(f"There is no lease {lease_id}. List leases with `gpusession leases`.")
        return row

    async def _owned(self, lease_id, auth, action: str) -> dict:
        """The lease's row, if the caller may `action` it; refused before anything changes."""
        lease_id = checks.lease_id(lease_id)
        # a lease granted while the caller's signature was valid may go on, and always be released
        who = authz.caller(auth, self.keys, expired_ok=True)
        row = await self._row(lease_id)
        authz.check_owner(row, who, action)
        return row

    def _view_of(self, row: dict, now: float) -> dict:
        view = views.lease_view(row, waiting=self.books.waiting.get(row["id"]),
                                version=self.books.version(row["id"]), now=now)
        view["pg_name"] = rayview.pg_name(self.ledger_id, row["id"])
        view["step"] = self.steps.get(row["id"])
        if row["state"] in (LeaseState.GRANTED.value, LeaseState.PLACED.value):
            # Ray places a group on a host it still lists after the host died (until it declares
            # it dead, ~15-60 s): the caller keeps its bundles off the hosts the broker knows lost.
            view["avoid_nodes"] = sorted(self.snapshot.lost)
        return view

    def _schedule(self) -> None:
        started = time.perf_counter()
        effects = self.books.schedule(self.snapshot.nodes_for(self.books.active()), time.time())
        self.meter.add("decide", time.perf_counter() - started)
        self._apply(effects)

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
                await self._tick()
            except Exception:  # one bad tick must not stop reconciliation
                log.exception("Reconciliation failed; retrying in %.1f s", TICK_S)

    async def _tick(self) -> None:
        before, began = self.snapshot, time.time()
        reading = await asyncio.to_thread(rayview.take, self.ledger_id, self.snapshot, set(self.books.rows))
        self.snapshot = self._keep_reported_lost(reading, began)
        _log_node_changes(before, self.snapshot)
        joined = rayview.joined(before, self.snapshot)
        if joined:
            await asyncio.to_thread(rayview.sweep_scratch_on, joined)
        if self.books.usage_stale(time.time()):
            await self._refresh_usage()
        now = time.time()  # no await from here on: the actions apply to the books as they are
        actions = reconcile.reconcile(
            list(self.books.rows.values()), self.snapshot, now=now, last_seen=self.last_seen,
            vanished_since=self.vanished, timeouts=self.timeouts,
        )
        doomed = [self._carry_out(action, now) for action in actions]
        self._schedule()
        doomed.append((await self._orphan_groups(), []))
        await asyncio.to_thread(_take_back, [d for d in doomed if d is not None])

    async def _orphan_groups(self) -> list[str]:
        """Groups whose lease is closed (its caller crashed mid-release) must not keep GPUs."""
        found = []
        for lease_id, group in list(self.snapshot.groups.items()):
            if lease_id in self.books.rows or group.state not in (PlacementState.CREATED, PlacementState.PENDING):
                continue
            row = self.books.recent(lease_id) or await self.journal.read("lease", lease_id)
            if row is not None and row["state"] == LeaseState.ENDED:  # ended is final: safe after the await
                log.info("Removing the orphaned group of closed lease %d", lease_id)
                found.append(group.pg_id)
        return found

    def _carry_out(self, action, now: float):
        """Apply one reconciliation action to the books; returns Ray work to do off the loop."""
        if isinstance(action, reconcile.MarkVanished):
            self.vanished[action.lease_id] = action.since
        elif isinstance(action, reconcile.Withdraw):
            self._apply(self.books.withdraw(action.lease_id))
        elif isinstance(action, reconcile.MarkPlaced):
            self._apply(self.books.place(action.lease_id, action.node_workers, now))
        elif isinstance(action, reconcile.Close):
            log.info("Closing lease %d (%s)", action.lease_id, action.reason)
            self._apply(self.books.close(action.lease_id, action.reason, action.released_at))
        elif isinstance(action, reconcile.Force):
            log.info("Forcing lease %d off its GPUs (%s)", action.lease_id, action.reason)
            group = self.snapshot.groups.get(action.lease_id)
            groups = [group.pg_id] if group is not None and group.state != PlacementState.REMOVED else []
            self._apply(self.books.close(action.lease_id, action.reason, now))
            return groups, self.workers.pop(action.lease_id, [])
        return None


def _log_node_changes(before, after) -> None:
    gpus = {node.node_id: node.gpus for node in after.nodes}
    for node_id, address in after.lost.items():
        if node_id not in before.lost:
            log.warning("Node %s (%s) does not answer: its %g GPUs leave the broker's capacity until it does",
                        node_id[:12], address, gpus.get(node_id, 0.0))
    for node_id, address in before.lost.items():
        if node_id not in after.lost:
            back = node_id in gpus
            log.info("Node %s (%s) %s", node_id[:12], address,
                     "answers again: its GPUs are back" if back else "is gone from Ray")


def _take_back(work: list[tuple[list[str], list]]) -> None:
    """Remove groups and kill worker actors (blocking Ray calls: run on a thread)."""
    for groups, actors in work:
        for pg_id in groups:
            rayview.remove_group(pg_id)
        rayview.kill_actors(actors)
