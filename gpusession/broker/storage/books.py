"""The broker's working state: open leases mirrored from the ledger, and the application of
policy decisions to both. No Ray here: the service feeds it snapshots and carries out effects.

The books are the truth while the broker runs; every change is also written to the journal,
which is the ledger itself (tests, tools) or the service's writer thread, which commits each
write in order while the event loop goes on (the service awaits the commit before replying)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..policy import elastic, policy
from .ledger import Ledger
from ..protocol.notice import NoticeKind, kind_of
from ..policy.model import ActiveLease, NodeCapacity, Placement, Priority, Quota, Request, Waiting
from ..policy.states import ACTIVE_STATES, LeaseState, check_move

log = logging.getLogger("gpusession.broker")

WEEK_S = 7 * 24 * 3600.0
CLOSED_KEPT = 1000
RETRY_WINDOW_S = 24 * 3600.0
USAGE_CACHE_S = 5.0  # the GPU-hour budget is coarse; recomputing per request would cost O(history)


@dataclass(frozen=True)
class PolicySettings:
    default_quota: Quota = Quota()
    allow_borrowing: bool = True
    preemption_grace_s: float = 30.0


@dataclass
class Notice:
    lease_id: int
    kind: NoticeKind
    reason: str
    deadline: float
    for_lease_id: int | None = None
    to_workers: int | None = None  # shrink and grow: the size the lease is asked to take
    node_workers: dict | None = None  # shrink: workers given up per node; grow: workers added per node
    by: dict | None = None  # shrink: who it is for ({"lease_id", "user", "priority"}), for the caller's line


@dataclass
class Effects:
    """What the service must do after a change: wake these waiters, send these notices."""

    changed: set[int] = field(default_factory=set)
    notices: list[Notice] = field(default_factory=list)


class Books:
    def __init__(self, ledger: Ledger, settings: PolicySettings, *, journal=None) -> None:
        """`journal`: where changes are written (the ledger's write methods); None: the ledger,
        synchronously, which also lets the books read usage and old requests from it."""
        self.ledger = ledger
        self.journal = journal or ledger
        self.synchronous = journal is None
        self.settings = settings
        self.rows: dict[int, dict] = {row["id"]: row for row in ledger.open_leases()}
        self.next_id = ledger.max_id() + 1  # ids are given here, so a write need not be awaited
        # A call Ray retries on a restarted broker is minutes old at most: a day of request ids
        # answers every retry from memory, with no ledger read on the request path.
        self.request_ids: dict[str, int] = ledger.request_ids_since(time.time() - RETRY_WINDOW_S)
        self.request_ids.update({row["request_id"]: row["id"] for row in self.rows.values()})
        self.waiting: dict[int, Waiting] = {}
        self.versions: dict[int, int] = {}
        self._quotas = {user: q.quota for user, q in ledger.quotas().items()}
        self._usage: tuple[float, dict[str, float]] | None = None
        self._closed: dict[int, dict] = {}  # recently closed rows, oldest first

    # ----- reading ---------------------------------------------------------------------------
    def quota_for(self, user: str) -> Quota:
        return self._quotas.get(user, self.settings.default_quota)

    def set_quota(self, user: str, quota: Quota | None) -> None:
        """An admin's change (None: back to the default), already written to the ledger."""
        if quota is None:
            self._quotas.pop(user, None)
        else:
            self._quotas[user] = quota

    def used_gpu_hours(self, now: float) -> dict[str, float]:
        """GPU-hours per user over 7 days. The service refreshes them off its loop (set_usage);
        synchronous books read the ledger when the figure is older than USAGE_CACHE_S."""
        if self.synchronous and (self._usage is None or now - self._usage[0] > USAGE_CACHE_S):
            self._usage = (now, self.ledger.gpu_hours_since(now - WEEK_S, now))
        return self._usage[1] if self._usage else {}

    def usage_stale(self, now: float) -> bool:
        return self._usage is None or now - self._usage[0] > USAGE_CACHE_S

    def set_usage(self, at: float, hours: dict[str, float]) -> None:
        self._usage = (at, hours)

    def find_request(self, request_id: str) -> int | None:
        """The lease of a request id the books know (open, or closed while this broker ran)."""
        return self.request_ids.get(request_id)

    def remember(self, row: dict) -> None:
        """A closed row read from the ledger (a retried request after a restart)."""
        self._closed[row["id"]] = row
        self.request_ids[row["request_id"]] = row["id"]

    def active(self) -> list[ActiveLease]:
        return [_active(row) for row in self.rows.values() if row["state"] in ACTIVE_STATES]

    def queue(self) -> list[Request]:
        return [_request(row) for row in self.rows.values() if row["state"] == LeaseState.QUEUED]

    def version(self, lease_id: int) -> int:
        return self.versions.get(lease_id, 0)

    # ----- changing --------------------------------------------------------------------------
    def add_request(self, fields: dict, nodes: list[NodeCapacity], now: float) -> tuple[int, Effects]:
        known = self.find_request(fields["request_id"])
        if known is None and self.synchronous:
            existing = self.ledger.lease_by_request_id(fields["request_id"])
            known = existing["id"] if existing else None
        if known is not None:  # a retried call (after a broker restart)
            return known, Effects()
        row = {**fields, "id": self.next_id, "state": LeaseState.QUEUED.value, "requested_at": now,
               "over_quota": False}
        if row.get("min_workers") is not None:  # elastic: remember the size it may grow back to
            row["full_workers"] = row["workers"]
        self.next_id += 1
        self.journal.add_lease(row)
        self.request_ids[row["request_id"]] = row["id"]
        row["priority"] = Priority(row["priority"])
        effects = Effects({row["id"]})
        quota = self.quota_for(row["user"])
        rejection = policy.check_admission(
            _request(row), nodes=nodes, quota=quota,
            used_gpu_hours=self.used_gpu_hours(now).get(row["user"], 0.0) if quota.gpu_hours is not None else 0.0,
            allow_borrowing=self.settings.allow_borrowing,
        )
        self.rows[row["id"]] = row
        if rejection:
            log.info("Rejected lease %d of %s: %s", row["id"], row["user"], rejection.message)
            self._reject(rejection, now, effects)
        return row["id"], effects

    def recent(self, lease_id: int) -> dict | None:
        """An open row, or one closed lately (kept so views need no ledger read)."""
        return self.rows.get(lease_id) or self._closed.get(lease_id)

    def schedule(self, nodes: list[NodeCapacity], now: float) -> Effects:
        effects = Effects()
        queue = self.queue()
        if not queue:
            self._offer(nodes, [], now, effects)
            return effects
        users = {r.user for r in queue}
        budgets = any(self.quota_for(u).gpu_hours is not None for u in users)
        decision = policy.decide(
            nodes=nodes,
            leases=self.active(),
            queue=queue,
            quotas=self._quotas,
            default_quota=self.settings.default_quota,
            used_gpu_hours=self.used_gpu_hours(now) if budgets else {},
            allow_borrowing=self.settings.allow_borrowing,
            now=now,
        )
        for rejection in decision.rejections:
            self._reject(rejection, now, effects)
        for grant in decision.grants:
            check_move(grant.lease_id, self.rows[grant.lease_id]["state"], LeaseState.GRANTED)
        if decision.grants:
            self.journal.grant([(g.lease_id, g.over_quota) for g in decision.grants], now)
            for grant in decision.grants:
                row = self.rows[grant.lease_id]
                row.update(state=LeaseState.GRANTED.value, granted_at=now, over_quota=grant.over_quota)
                self.waiting.pop(grant.lease_id, None)
                self._bump(grant.lease_id, effects)
                log.info("Granted lease %d of %s: %g GPUs%s", grant.lease_id, row["user"], row["gpus"],
                         " (over quota)" if grant.over_quota else "")
        for preempt in decision.preemptions:
            self._preempt(preempt, now, effects)
        for lease_id, waiting in decision.waiting.items():
            if self.waiting.get(lease_id) != waiting:
                self.waiting[lease_id] = waiting
                self._bump(lease_id, effects)
        self._offer(nodes, [r for r in queue if r.lease_id in decision.waiting], now, effects)
        return effects

    def _offer(self, nodes: list[NodeCapacity], waiting: list[Request], now: float, effects: Effects) -> None:
        """Offer free GPUs to elastic leases that shrank (broker/policy/elastic.py decides who gets what)."""
        if not any((row.get("full_workers") or 0) > row["workers"] for row in self.rows.values()):
            return  # the common case costs one scan, no board
        leases = self.active()
        free = policy.free_gpus(nodes, leases)
        for offer in elastic.offers(leases, free, waiting):
            row = self.rows[offer.lease_id]
            log.info("Offering lease %d of %s %d more workers (%d -> %d)", offer.lease_id, row["user"],
                     offer.to_workers - row["workers"], row["workers"], offer.to_workers)
            self.notify(Notice(offer.lease_id, NoticeKind.GROW, "free GPUs offered back",
                               now + self.settings.preemption_grace_s, to_workers=offer.to_workers,
                               node_workers=dict(offer.add)), effects)

    def resize(self, lease_id: int, workers: int, node_workers: dict[str, int] | None, now: float) -> Effects:
        """The lease now holds `workers` (a shrink it made, an offer it took, or where its regrown
        group landed): its size changes from now on, its GPU-seconds so far are kept, its notice
        is cleared. The service checked the request against the notice."""
        row = self.rows[lease_id]
        effects = Effects()
        old_gpus, sized_at = row["gpus"], row.get("sized_at") or row["granted_at"]
        gpus = workers * row["gpus_per_worker"]
        if node_workers is None:  # an accepted offer: the policy's plan until the group is placed
            node_workers = dict(row.get("node_workers") or {})
            for node, n in ((row.get("notice") or {}).get("node_workers") or {}).items():
                node_workers[node] = node_workers.get(node, 0) + n
        if workers != row["workers"]:
            before = (row.get("gpu_seconds_before") or 0.0) + old_gpus * max(0.0, now - sized_at)
            segment = (row["user"], old_gpus, sized_at, max(now, sized_at))
            self.journal.resize(lease_id, workers, gpus, node_workers, now, before, segment)
            row.update(workers=workers, gpus=gpus, node_workers=node_workers, sized_at=now,
                       gpu_seconds_before=before, notice=None, preempted_for=None)
            log.info("Lease %d of %s now holds %d workers (%g GPUs, was %g)", lease_id, row["user"], workers,
                     gpus, old_gpus)
        else:
            self.journal.resize(lease_id, workers, gpus, node_workers, sized_at, row.get("gpu_seconds_before"), None)
            row.update(node_workers=node_workers, notice=None, preempted_for=None)
        self._bump(lease_id, effects)
        return effects

    def withdraw(self, lease_id: int) -> Effects:
        """An offer to grow that was not taken in time: the GPUs go back to everyone."""
        effects = Effects()
        row = self.rows.get(lease_id)
        if row is not None and kind_of(row.get("notice")) is NoticeKind.GROW:
            self.journal.set_notice(lease_id, None, None)
            row.update(notice=None, preempted_for=None)
            self._bump(lease_id, effects)
        return effects

    def place(self, lease_id: int, node_workers: dict[str, int], now: float) -> Effects:
        row = self.rows.get(lease_id)
        effects = Effects()
        if row is not None and row["state"] == LeaseState.GRANTED:
            self.journal.place(lease_id, node_workers, now)
            row.update(state=LeaseState.PLACED.value, placed_at=now, node_workers=node_workers)
            self._bump(lease_id, effects)
        return effects

    def record_gpu_ids(self, lease_id: int, gpu_ids: dict[str, list[list[str]]]) -> Effects:
        """The GPU ids of a granted or placed lease's workers (already checked by the service)."""
        row = self.rows.get(lease_id)
        effects = Effects()
        if row is not None and row["state"] in ACTIVE_STATES and row.get("gpu_ids") != gpu_ids:
            self.journal.set_gpu_ids(lease_id, gpu_ids)
            row["gpu_ids"] = gpu_ids
            self._bump(lease_id, effects)
        return effects

    def gpu_id_holders(self) -> list[tuple[int, float, dict]]:
        """(lease id, GPUs per worker, GPU ids) of every live lease whose ids are known."""
        return [(row["id"], row["gpus_per_worker"], row["gpu_ids"]) for row in self.rows.values()
                if row.get("gpu_ids") and row["state"] in ACTIVE_STATES]

    def close(self, lease_id: int, reason: str, released_at: float) -> Effects:
        effects = Effects()
        self._close(lease_id, reason, released_at, effects)
        return effects

    def notify(self, notice: Notice, effects: Effects | None = None) -> Effects:
        """Record a notice (preempt, revoke) on a lease; its caller is woken through effects."""
        effects = effects if effects is not None else Effects()
        row = self.rows[notice.lease_id]
        payload = {"kind": NoticeKind(notice.kind).value, "reason": notice.reason, "deadline": notice.deadline,
                   "for_lease_id": notice.for_lease_id, "reason_code": _reason_code(notice.kind),
                   # unique across broker restarts too: a watcher skips the notice it has seen by this id
                   "id": f"{notice.lease_id}-{NoticeKind(notice.kind).value}-{notice.deadline!r}"}
        if notice.to_workers is not None:
            payload.update(to_workers=notice.to_workers, to_gpus=notice.to_workers * row["gpus_per_worker"],
                           node_workers=notice.node_workers, by=notice.by)
        self.journal.set_notice(notice.lease_id, payload, notice.for_lease_id)
        row.update(notice=payload, preempted_for=notice.for_lease_id)
        effects.notices.append(notice)
        self._bump(notice.lease_id, effects)
        return effects

    def _preempt(self, preempt, now: float, effects: Effects) -> None:
        victim, claimant = self.rows[preempt.victim_id], self.rows[preempt.for_lease_id]
        if preempt.shrink_to_workers is not None:
            log.info("Shrinking lease %d of %s (%s) from %d to %d workers for lease %d of %s", victim["id"],
                     victim["user"], preempt.reason, victim["workers"], preempt.shrink_to_workers, claimant["id"],
                     claimant["user"])
            by = {"lease_id": claimant["id"], "user": claimant["user"], "priority": Priority(claimant["priority"]).label}
            self.notify(Notice(
                victim["id"], NoticeKind.SHRINK,
                f"preempted ({preempt.reason}) for lease {claimant['id']} of {claimant['user']}",
                now + self.settings.preemption_grace_s, claimant["id"], to_workers=preempt.shrink_to_workers,
                node_workers=dict(preempt.give_node_workers or {}), by=by), effects)
            return
        log.info("Preempting lease %d of %s (%s) for lease %d of %s", victim["id"], victim["user"],
                 preempt.reason, claimant["id"], claimant["user"])
        notice = Notice(
            victim["id"], NoticeKind.PREEMPT,
            f"preempted ({preempt.reason}) for lease {claimant['id']} of {claimant['user']}",
            now + self.settings.preemption_grace_s, claimant["id"],
        )
        self.notify(notice, effects)

    def _reject(self, rejection, now: float, effects: Effects) -> None:
        notice = {"error": rejection.error, "message": rejection.message}
        self.journal.set_notice(rejection.lease_id, notice, None)
        self.rows[rejection.lease_id]["notice"] = notice
        self._close(rejection.lease_id, "rejected", now, effects)

    def _close(self, lease_id: int, reason: str, released_at: float, effects: Effects) -> None:
        row = self.rows.pop(lease_id, None)  # not open: already closed, a retry changes nothing
        self.waiting.pop(lease_id, None)
        closed = None
        if row is not None:
            check_move(lease_id, row["state"], LeaseState.ENDED)
            closed = _closed_row(row, reason, released_at)
            self.journal.close(lease_id, reason, closed["released_at"], closed["gpu_seconds"])
        if closed is not None:
            self._closed[lease_id] = closed
            if len(self._closed) > CLOSED_KEPT:
                self._closed.pop(next(iter(self._closed)))
            if closed.get("gpu_seconds") and self._usage is not None:  # stale now: refresh before use
                self._usage = (float("-inf"), self._usage[1])
            if closed.get("granted_at") is not None:
                log.info("Released lease %d of %s (%s): %.1f GPU-seconds", lease_id, closed["user"],
                         reason, closed["gpu_seconds"])
        self._bump(lease_id, effects)

    def _bump(self, lease_id: int, effects: Effects) -> None:
        self.versions[lease_id] = self.versions.get(lease_id, 0) + 1
        effects.changed.add(lease_id)


def _reason_code(kind: str) -> str:
    return "revoked" if NoticeKind(kind) is NoticeKind.REVOKE else "preempted"


def _closed_row(row: dict, reason: str, released_at: float) -> dict:
    """The row as closed now: held from its grant to `released_at` (never before the grant),
    billed only if Ray placed it: a grant that never became GPUs (its node was lost, its caller
    gave up) costs its user nothing."""
    granted = row.get("granted_at")
    released = max(released_at, granted) if granted is not None else released_at
    placed = row.get("placed_at") is not None
    gpu_seconds = 0.0
    if granted is not None and placed:  # an elastic lease: its earlier sizes, then the current one
        sized_at = min(row.get("sized_at") or granted, released)
        gpu_seconds = (row.get("gpu_seconds_before") or 0.0) + row["gpus"] * (released - sized_at)
    return {**row, "state": LeaseState.ENDED.value, "end_reason": reason, "released_at": released,
            "gpu_seconds": gpu_seconds}


def _request(row: dict) -> Request:
    return Request(
        lease_id=row["id"], user=row["user"], workers=row["workers"],
        gpus_per_worker=row["gpus_per_worker"], priority=Priority(row["priority"]),
        placement=Placement(row["placement"]), arrival=row["requested_at"],
        max_hold_s=row.get("max_hold_s"), min_workers=row.get("min_workers"),
    )


def _active(row: dict) -> ActiveLease:
    hold = row.get("max_hold_s")
    notice = row.get("notice") or {}
    workers = row["workers"]
    node_workers = row.get("node_workers") if row["state"] == LeaseState.PLACED else None
    giving = None
    if kind_of(notice) is NoticeKind.SHRINK:
        giving = notice.get("node_workers") or {}
    elif kind_of(notice) is NoticeKind.GROW and node_workers is not None:
        # an offer stands: the offered GPUs are the lease's until it takes them or the offer lapses
        workers = notice["to_workers"]
        node_workers = dict(node_workers)
        for node, n in (notice.get("node_workers") or {}).items():
            node_workers[node] = node_workers.get(node, 0) + n
    return ActiveLease(
        lease_id=row["id"], user=row["user"], workers=workers,
        gpus_per_worker=row["gpus_per_worker"], priority=Priority(row["priority"]),
        over_quota=bool(row.get("over_quota")), granted_at=row["granted_at"],
        ends_by=row["granted_at"] + hold if hold else None,
        node_workers=node_workers,
        preempted_for=row.get("preempted_for"), min_workers=row.get("min_workers"),
        placement=Placement(row["placement"]), full_workers=row.get("full_workers"),
        giving=giving, noticed=bool(notice.get("kind")),
    )
