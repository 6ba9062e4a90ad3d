"""PURE: one walk of the ordered queue (the working part of policy.decide).

Run.schedule walks the queue once, in order, and returns why each request still waits (a
shared Wait per distinct reason); policy.py formats each reason once. The walk is the hot path
of a 10,000-request queue: once the head is known, a request that cannot fit in the free GPUs
costs a few attribute lookups, and fit and backfill answers are remembered per request shape
until the free GPUs change.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

from . import messages
from .board import Board, Reservation, beyond, reserve
from .model import EPSILON, ActiveLease, Decision, Grant, Priority, Quota, Reject, Request
from .placement import NodeGpus, NodeWorkers, Plan, give, gpus_of, plan
from .preemption import choose_takings, eligible, newest_first, notice


class Wait:
    """Why requests wait: one instance per distinct reason per call, shared by its requests.
    policy.py fills in kind and text after the walk, when the final numbers are known."""

    __slots__ = ("code", "kind", "reason", "shared")

    def __init__(self, *code: object) -> None:
        self.code = code
        self.kind = self.reason = self.shared = None


class User:
    """One user's limits and in-quota GPUs (active leases, plus grants and holds of this call)."""

    __slots__ = ("ceiling", "headroom", "max_gpus", "name", "quota", "refusal", "top", "usage",
                 "wait")

    def __init__(self, name: str, quota: Quota, *, usage: float, used_hours: float) -> None:
        self.name, self.quota = name, quota
        self.max_gpus = float("inf") if quota.max_gpus is None else quota.max_gpus
        self.ceiling = self.max_gpus + EPSILON  # a request of more can never be within quota
        spent = quota.gpu_hours is not None and used_hours >= quota.gpu_hours
        self.refusal = messages.budget_spent(name, used=used_hours, quota=quota) if spent else None
        self.top = -1 if spent else int(quota.max_priority)  # highest priority it may queue at
        self.wait = Wait("quota", name)
        self.usage = 0.0
        self.add(usage)

    def add(self, gpus: float) -> None:
        self.usage += gpus
        self.headroom = self.max_gpus - self.usage + EPSILON  # a request of more is over quota


class Users(dict):
    """name -> User, built on first use (the queue may name users without a quota row)."""

    def __init__(self, quotas: Mapping[str, Quota], default_quota: Quota,
                 used_gpu_hours: Mapping[str, float], leases: Sequence[ActiveLease]) -> None:
        super().__init__()
        self.quotas, self.default, self.hours = quotas, default_quota, used_gpu_hours
        self.usage: dict[str, float] = {}
        for lease in leases:
            if not lease.over_quota:  # borrowed GPUs do not count against max_gpus
                self.usage[lease.user] = self.usage.get(lease.user, 0.0) + lease.gpus

    def __missing__(self, name: str) -> User:
        quota = self.quotas.get(name, self.default)
        usage, hours = self.usage.get(name, 0.0), self.hours.get(name, 0.0)
        self[name] = user = User(name, quota, usage=usage, used_hours=hours)
        return user


class Cutoffs(NamedTuple):
    """What no request can get any more in this call, so that most of a long queue is judged
    with a comparison or two. Free GPUs only shrink during a call; refreshed after each change."""

    room: float  # with a head: a request needing more GPUs does not fit now (else inf)
    spare: float  # with a head: one needing more would delay it...
    longest: float  # ...unless it declared a run time of at most this
    borrow: float  # a borrower needing more gets nothing: not from free GPUs, not by preempting

    def held_back(self, r: Request, gpus: float) -> bool:
        """r fits now, maybe, but starting it would delay the head."""
        return gpus > self.spare and (r.max_hold_s is None or r.max_hold_s > self.longest)


class Run:
    """The working state of one decide() call. Never outlives it."""

    def __init__(self, *, board: Board, leases: Sequence[ActiveLease], users: Users,
                 borrowing: bool, now: float) -> None:
        self.board, self.leases, self.users = board, leases, users
        self.borrowing, self.now = borrowing, now
        self.decision = Decision()
        self.granted: list[tuple[Request, NodeGpus]] = []
        self.head: Reservation | None = None
        self.preempt_open = True  # until a request within quota finds no victims
        self.pool = newest_first(leases)  # leases that may still be preempted
        self.plans: dict[tuple, Plan] = {}  # shape -> plan on the free GPUs
        self.refused: set[tuple] = set()  # (shape, hold) the head refused, same free GPUs
        self.unreservable: set[tuple] = set()  # shapes that fit not even the idle cluster
        self.no_victims: set[tuple] = set()  # (shape, priority, in quota): preemption can't help
        self.capacity, self.held, self.next_in_line = Wait("capacity"), Wait("held"), Wait("head")
        self.preemption: dict[int, Wait] = {}  # victims releasing -> Wait

    def schedule(self, order: Sequence[Request]) -> tuple[list[int], list[Wait]]:
        """The ids of the requests left waiting, in order, and why each waits."""
        ids: list[int] = []
        waits: list = []
        wait_id, wait_on = ids.append, waits.append  # bound once: the loop runs 10,000 times
        users, borrowing, capacity, held = self.users, self.borrowing, self.capacity, self.held
        earmarked, deferred, level = self.board.earmarked, [], None
        for r in order:
            priority = r.priority
            if priority is not level:  # borrowers of a priority go after those within quota
                self._borrow(deferred, waits)
                deferred, level = [], priority
                cut = self._cutoffs(level)
            user = users[r.user]
            if priority > user.top:
                self._reject(r, user)
                continue
            gpus, lease_id = r.workers * r.gpus_per_worker, r.lease_id
            if gpus <= user.headroom:
                if lease_id in earmarked or (gpus <= cut.room and not cut.held_back(r, gpus)):
                    wait = self._consider(r, user, in_quota=True)
                    cut = self._cutoffs(level)
                    if wait is None:
                        continue  # granted
                else:  # the common case in a long queue: nothing to try
                    wait = capacity if gpus > cut.room else held
            elif not borrowing:
                if gpus > user.ceiling:  # max_gpus was lowered since admission
                    self._reject_ceiling(r, user)
                    continue
                wait = user.wait
            elif gpus > cut.borrow and lease_id not in earmarked:
                wait = user.wait  # nothing idle to borrow, nobody to preempt
            else:
                deferred.append((len(waits), r))
                wait = None  # decided once this priority's requests within quota had their turn
            wait_id(lease_id)
            wait_on(wait)
        self._borrow(deferred, waits)
        return _still_waiting(ids, waits)

    def _cutoffs(self, priority: Priority) -> Cutoffs:
        room = self.board.free_total + EPSILON
        borrow = room  # plus what a borrower of this priority could still preempt:
        if self.preempt_open:
            footprint = self.board.footprint
            borrow += sum(sum(footprint[lease.lease_id].values())
                          for lease in self.pool if lease.priority < priority)
        if self.head is None:
            return Cutoffs(math.inf, math.inf, -math.inf, borrow)
        spare, longest = self.head.spare(), self.head.longest_hold(now=self.now)
        return Cutoffs(room, spare, longest, borrow)

    def _borrow(self, deferred: list[tuple[int, Request]], waits: list) -> None:
        if not deferred:
            return
        level = deferred[0][1].priority
        cut = self._cutoffs(level)
        for slot, r in deferred:
            user = self.users[r.user]
            gpus = r.gpus
            hopeless = gpus > cut.borrow or gpus > cut.room or cut.held_back(r, gpus)
            if hopeless and r.lease_id not in self.board.earmarked:
                waits[slot] = user.wait
            else:
                waits[slot] = self._consider(r, user, in_quota=False)
                cut = self._cutoffs(level)

    def _consider(self, r: Request, user: User, *, in_quota: bool) -> Wait | None:
        """Grant, hold for victims, preempt, or become the head; else why r waits."""
        where = self._plan_now(r)
        if where is not None:
            gpus = gpus_of(where, r.gpus_per_worker)
            if self.head is None or self._admitted(r, gpus):
                self._grant(r, user, where, gpus, in_quota=in_quota)
                return None
            return self.held if in_quota else user.wait
        if r.lease_id in self.board.earmarked:
            wait = self._await_victims(r, user, in_quota=in_quota)
            if wait is not None:
                return wait
        if self.preempt_open:
            wait = self._preempt(r, user, in_quota=in_quota)
            if wait is not None:
                return wait
            if in_quota:  # a borrower finding no victims stops nobody else
                self.preempt_open = False
        if in_quota and self.head is None:
            return self._become_head(r)
        return self.capacity if in_quota else user.wait

    def _plan_now(self, r: Request) -> Plan:
        if r.workers * r.gpus_per_worker > self.board.free_total + EPSILON:
            return None
        shape = (r.workers, r.gpus_per_worker, r.placement)
        if shape not in self.plans:
            self.plans[shape] = plan(self.board.free, *shape)
        return self.plans[shape]

    def _admitted(self, r: Request, gpus: NodeGpus) -> bool:
        key = (r.workers, r.gpus_per_worker, r.placement, r.max_hold_s)
        if key in self.refused:
            return False
        if self.head.admits(r, gpus, now=self.now):
            return True
        self.refused.add(key)
        return False

    def _occupy(self, gpus: NodeGpus) -> None:
        self.board.occupy(gpus)
        # What did not fit still does not fit: free GPUs only shrink during a call
        self.plans = {shape: p for shape, p in self.plans.items() if p is None}
        self.refused.clear()

    def _grant(self, r: Request, user: User, where: NodeWorkers, gpus: NodeGpus, *,
               in_quota: bool) -> None:
        self.decision.grants.append(Grant(r.lease_id, not in_quota, where))
        self.granted.append((r, gpus))
        self._occupy(gpus)
        if in_quota:
            user.add(r.gpus)

    def _hold(self, r: Request, user: User, gpus: NodeGpus, *, in_quota: bool) -> None:
        """Keep free GPUs for a request whose victims are releasing the rest of what it needs."""
        self._occupy(gpus)
        if in_quota:  # counted now, so the user's next request does not preempt for nothing
            user.add(r.gpus)

    def _with_victims(self, r: Request) -> tuple[NodeGpus, NodeGpus]:
        """(GPUs of r's noticed victims, free GPUs plus those) per node."""
        mark = dict(self.board.earmarked.get(r.lease_id, {}))
        view = dict(self.board.free)
        give(view, mark)
        return mark, view

    def _await_victims(self, r: Request, user: User, *, in_quota: bool) -> Wait | None:
        """Leases told earlier to make room for r are still releasing: wait for them."""
        mark, view = self._with_victims(r)
        where = plan(view, r.workers, r.gpus_per_worker, r.placement)
        if where is None:
            return None  # no longer enough (a node shrank): it may preempt more
        rest = beyond(gpus_of(where, r.gpus_per_worker), mark)
        if self.head is None or self.head.admits(r, rest, now=self.now):
            self._hold(r, user, rest, in_quota=in_quota)
        return self._waiting_for_victims(r)

    def _preempt(self, r: Request, user: User, *, in_quota: bool) -> Wait | None:
        shape = (r.workers, r.gpus_per_worker, r.placement, r.priority, in_quota)
        if shape in self.no_victims and r.lease_id not in self.board.earmarked:
            return None
        mark, view = self._with_victims(r)
        candidates = eligible(r, self.pool, in_quota=in_quota)
        footprint = self.board.footprint
        takings = choose_takings(r, candidates=candidates, footprint=footprint, free=view)
        if not takings:
            self.no_victims.add(shape)
            return None
        for taking in takings:  # an elastic victim gives up only what r needs (broker/policy/elastic.py)
            self.decision.preemptions.append(notice(taking.lease, r, taking))
            give(view, taking.gpus)
            give(mark, taking.gpus, add_nodes=True)
        victims = [taking.lease for taking in takings]
        chosen = {victim.lease_id for victim in victims}
        self.pool = [lease for lease in self.pool if lease.lease_id not in chosen]
        self.board.earmarked[r.lease_id] = mark
        self.board.notices[r.lease_id] = self.board.notices.get(r.lease_id, 0) + len(victims)
        where = plan(view, r.workers, r.gpus_per_worker, r.placement)
        self._hold(r, user, beyond(gpus_of(where, r.gpus_per_worker), mark), in_quota=in_quota)
        return self._waiting_for_victims(r)

    def _waiting_for_victims(self, r: Request) -> Wait:
        victims = self.board.notices[r.lease_id]
        if victims not in self.preemption:
            self.preemption[victims] = Wait("preemption", victims)
        return self.preemption[victims]

    def _become_head(self, r: Request) -> Wait:
        shape = (r.workers, r.gpus_per_worker, r.placement)
        if shape in self.unreservable:
            return self.capacity
        head = reserve(r, board=self.board, leases=self.leases, granted=self.granted, now=self.now)
        if head is None:
            self.unreservable.add(shape)
            return self.capacity
        self.head = head
        self.refused.clear()
        return self.next_in_line

    def _reject(self, r: Request, user: User) -> None:
        if user.refusal is not None:
            reject = Reject(r.lease_id, messages.QUOTA_EXCEEDED, user.refusal)
        else:
            reject = messages.priority_too_high(r, user.quota)
        self.decision.rejections.append(reject)

    def _reject_ceiling(self, r: Request, user: User) -> None:
        reject = messages.over_ceiling(r, ceiling=user.max_gpus, quota=user.quota, borrowing=False)
        self.decision.rejections.append(reject)


def _still_waiting(ids: list[int], waits: list) -> tuple[list[int], list[Wait]]:
    """Drop the borrowers that were granted at the end of their priority."""
    if None not in waits:
        return ids, waits
    kept = [(i, wait) for i, wait in zip(ids, waits) if wait is not None]
    return [i for i, _ in kept], [wait for _, wait in kept]
