"""PURE: the cluster as one decide() call sees it, and the reservation of the head of the queue.

Board: GPUs per node (capacity, free now), where every active lease sits (placed by Ray, or
simulated with the same fit function while Ray has not placed it yet), and which GPUs are
earmarked for a request because leases were told to make room for it.

Reservation: EASY backfilling. The head (the first request within quota that neither fits
nor can preempt) gets a shadow time: the earliest time it would fit if every lease ended at
its declared `ends_by`. A later request may start before it only if it does not delay it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from .model import EPSILON, ActiveLease, NodeCapacity, Request
from .placement import NodeGpus, drain, give, gpus_of, plan, take


@dataclass
class Board:
    """Scratch state of one decide() call (mutated as it grants); never returned."""

    capacity: NodeGpus  # node GPUs minus unmanaged: what leases could use once all ended
    free: NodeGpus  # free now, after this call's grants and held GPUs
    footprint: dict[int, NodeGpus]  # active lease id -> its GPUs per node
    earmarked: dict[int, NodeGpus] = field(default_factory=dict)  # request id -> victims' GPUs
    notices: dict[int, int] = field(default_factory=dict)  # request id -> victims releasing
    free_total: float = 0.0  # sum of positive free GPUs: a cheap "cannot fit" test

    def occupy(self, gpus: NodeGpus) -> None:
        take(self.free, gpus)
        self.count_free()

    def count_free(self) -> None:
        self.free_total = sum(f for f in self.free.values() if f > 0.0)


def build_board(
    nodes: Sequence[NodeCapacity], leases: Sequence[ActiveLease], queued_targets: set[int]
) -> Board:
    """The board before scheduling; `queued_targets`: queued ids that leases make room for."""
    capacity = {n.node_id: n.gpus - n.unmanaged for n in nodes}
    board = Board(capacity=capacity, free=dict(capacity), footprint={})
    for lease in leases:
        if lease.node_workers is not None:
            board.footprint[lease.lease_id] = gpus_of(lease.node_workers, lease.gpus_per_worker)
            take(board.free, board.footprint[lease.lease_id])
    # Granted but not placed yet: Ray places them before anything queued now, oldest first.
    unplaced = [lease for lease in leases if lease.node_workers is None]
    for lease in sorted(unplaced, key=lambda lease: (lease.granted_at, lease.lease_id)):
        where = plan(board.free, lease.workers, lease.gpus_per_worker, lease.placement)
        if where is None:  # a node shrank under it: its GPUs still count, somewhere
            gpus = drain(board.free, lease.gpus)
        else:
            gpus = gpus_of(where, lease.gpus_per_worker)
        board.footprint[lease.lease_id] = gpus
        take(board.free, gpus)
    _earmark(board, leases, queued_targets)
    board.count_free()
    return board


def _earmark(board: Board, leases: Sequence[ActiveLease], queued_targets: set[int]) -> None:
    """GPUs of leases under notice belong to the request they make room for, if it still waits."""
    for lease in leases:
        target = lease.preempted_for
        if target is None or target not in queued_targets:
            continue
        mark = board.earmarked.setdefault(target, {})
        give(mark, releasing(board, lease), add_nodes=True)
        board.notices[target] = board.notices.get(target, 0) + 1


def releasing(board: Board, lease: ActiveLease) -> NodeGpus:
    """What a lease under notice gives back: all its GPUs, or those of the workers it was told
    to give up when it shrinks (an elastic lease keeps the rest)."""
    if lease.giving is None:
        return board.footprint[lease.lease_id]
    return gpus_of(lease.giving, lease.gpus_per_worker)


def beyond(need: NodeGpus, covered: NodeGpus) -> NodeGpus:
    """The part of `need` (per node) that `covered` does not provide."""
    out = {node: n - covered.get(node, 0.0) for node, n in need.items()}
    return {node: n for node, n in out.items() if n > EPSILON}


@dataclass
class Reservation:
    """The head of the queue and the GPUs it counts on at its shadow time."""

    head: Request
    at: float  # shadow time; math.inf when some lease it waits for has no declared end
    free_then: NodeGpus  # free at `at` (the worst case when inf), minus what backfills keep

    def admits(self, request: Request, gpus: NodeGpus, *, now: float) -> bool:
        """May `request` (placed on `gpus`) start now without delaying the head? Commits if so."""
        if request.max_hold_s is not None and now + request.max_hold_s <= self.at < math.inf:
            return True  # it will be gone before the head can start
        trial = dict(self.free_then)
        take(trial, gpus)
        head = self.head
        if plan(trial, head.workers, head.gpus_per_worker, head.placement) is None:
            return False
        self.free_then = trial  # it may still hold these when the head starts
        return True

    def spare(self) -> float:
        """GPUs a request may take and still pass the second test of `admits`: more is refused
        for sure (it takes that much from free_then, which is at least the free GPUs now)."""
        return sum(f for f in self.free_then.values() if f > 0.0) - self.head.gpus + EPSILON

    def longest_hold(self, *, now: float) -> float:
        """A request declaring at most this run time passes the first test of `admits`."""
        return self.at - now if self.at < math.inf else -math.inf


@dataclass(frozen=True)
class Release:
    at: float
    gpus: NodeGpus


def reserve(
    head: Request,
    *,
    board: Board,
    leases: Sequence[ActiveLease],
    granted: Sequence[tuple[Request, NodeGpus]],
    now: float,
) -> Reservation | None:
    """The head's reservation, or None if it could not run even on the idle cluster as it is."""
    workers, gpw, placement = head.workers, head.gpus_per_worker, head.placement
    if plan(board.capacity, workers, gpw, placement) is None:
        return None  # e.g. unmanaged GPUs or a lost node: reserving would only block others
    state = dict(board.free)
    events = sorted(_releases(head, board, leases, granted, now=now), key=lambda e: e.at)
    for i, event in enumerate(events):
        give(state, event.gpus)
        last_at_this_time = i + 1 == len(events) or events[i + 1].at > event.at
        if last_at_this_time and plan(state, workers, gpw, placement) is not None:
            return Reservation(head, event.at, state)
    return Reservation(head, math.inf, _worst_case(head, board, leases, granted))


def _releases(head, board, leases, granted, *, now: float) -> Iterator[Release]:
    """When GPUs come back, as far as anyone declared; what is earmarked goes to its request."""
    for lease in leases:
        target = lease.preempted_for
        if target is not None and target in board.earmarked:
            if target == head.lease_id:
                yield Release(now, releasing(board, lease))
            continue  # it makes room for another request: never comes back to the head
        if lease.ends_by is not None:
            yield Release(max(lease.ends_by, now), board.footprint[lease.lease_id])
    for request, gpus in granted:
        if request.max_hold_s is not None:
            yield Release(now + request.max_hold_s, gpus)


def _worst_case(head, board, leases, granted) -> NodeGpus:
    """Free GPUs once every lease ended, except those granted after the head arrived with no
    declared end: they stand for earlier backfills, so a stream of small requests cannot keep
    the head waiting across decisions."""
    state = dict(board.capacity)
    for lease in leases:
        stays = lease.ends_by is None and lease.preempted_for is None
        if stays and lease.granted_at >= head.arrival:
            take(state, board.footprint[lease.lease_id])
    for request, gpus in granted:
        if request.max_hold_s is None:
            take(state, gpus)
    return state
