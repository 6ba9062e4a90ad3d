"""PURE: the follower's judgements, apart from the loop that gathers what they judge.

Which failure is the root cause, whether a lost worker's host is to blame, and what the clock
says (the run's timeout, a stop or a resize waiting for a commit). No Ray, no clock, no I/O:
the follower passes the times and facts in (tests/unit/test_run_judgements.py).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from ...broker.protocol.notice import NoticeKind

ROOT_CAUSE, COLLATERAL = 0, 2  # a failure's rank: a rank's own error or death / the echo of a peer's


@dataclass(frozen=True)
class Failure:
    """One rank's failure as reported: `collateral` when it looks like the echo of a peer's
    (a collective that lost its peer), else a root cause. `host_lost`: the rank's whole host went
    (it explains its ranks' deaths and the echoes elsewhere). `died_s`: for a rank whose process
    died, seconds since that was reported (None for any other failure)."""

    collateral: bool
    index: int  # its place in the order failures came in
    host_lost: bool = False
    died_s: float | None = None


def root_cause(failures: Sequence[Failure], *, waited_s: float, grace_s: float, ranks_left: int,
               death_gather_s: float = 0.0) -> int | None:
    """The index of the failure that ends the attempt, or None to wait for a root cause.

    A lost host ends it at once, before anything else reported: its ranks' deaths and its peers'
    echoes are its consequences. A rank's own error ends it at once; a rank's process death only
    after `death_gather_s`: the processes of a host that dies do not all go at once, and a rank
    can die (its worker telling so) a moment before its host's heartbeat stops. An echo ends it
    only after `grace_s` (its peers had a moment to report theirs). With no rank left to report,
    the best failure reported ends it. The first root cause wins, else the first echo."""
    if not failures:
        return None
    hosts = [f for f in failures if f.host_lost]
    if hosts:
        return hosts[0].index
    best = min(failures, key=lambda f: (f.collateral, f.index))
    if ranks_left == 0:
        return best.index
    if best.collateral:
        return best.index if waited_s >= grace_s else None
    if best.died_s is not None and best.died_s < death_gather_s:
        return None
    return best.index


class Blame(enum.Enum):
    HOST = "host"  # the host does not answer: every rank on it is gone
    SUSPECT = "suspect"  # the host answers for now: ask again in a moment
    WORKER = "worker"  # the host still answers after the settling time: only these workers went


def blame(*, node_known: bool, host_answers: bool, settled: bool) -> Blame:
    """Whom to blame for a lost worker. A host that dies loses its processes one by one (a
    worker gone, its raylet still answering), so a host that answers is asked again once before
    the loss is called one worker's."""
    if node_known and not host_answers:
        return Blame.HOST
    if node_known and not settled:
        return Blame.SUSPECT
    return Blame.WORKER


def losses_gathered(first_loss_at: float, now: float, gather_s: float) -> bool:
    """Whether the other ranks of a host had `gather_s` to report their lost heartbeats too."""
    return now - first_loss_at >= gather_s


def poll_timeout(now: float, deadline: float | None, poll_s: float) -> float:
    """How long the loop may wait for a message: `poll_s`, less if the run's deadline is nearer."""
    if deadline is None:
        return poll_s
    return max(0.0, min(poll_s, deadline - now))


class ClockVerdict(enum.Enum):
    NOTHING = "nothing"
    TIMED_OUT = "timed out"  # past the run's timeout with ranks still running
    STOP = "stop"  # preempted or revoked: no commit came before the broker's deadline
    RESIZE = "resize"  # told to shrink: no commit came in time, resume from the last one
    OFFER_LAPSED = "offer lapsed"  # an offer to grow not taken in time


def clock_verdict(now: float, *, deadline: float | None, ranks_left: int, stop_at: float | None,
                  resize_at: float | None, resize_kind: NoticeKind | None) -> ClockVerdict:
    """What the clock says now, the run's timeout first."""
    if deadline is not None and now >= deadline and ranks_left:
        return ClockVerdict.TIMED_OUT
    if stop_at is not None and now >= stop_at:
        return ClockVerdict.STOP
    if resize_at is not None and now >= resize_at:
        return ClockVerdict.RESIZE if resize_kind is NoticeKind.SHRINK else ClockVerdict.OFFER_LAPSED
    return ClockVerdict.NOTHING


class NoticeResponse(enum.Enum):
    RESIZE_AT_COMMIT = "resize at the next commit"
    STOP_AT_COMMIT = "stop at the next commit"  # or just before the broker's deadline
    STOP_NOW = "stop now"


def respond_to_notice(kind: NoticeKind, *, graceful: bool, commits: bool) -> NoticeResponse:
    """A notice during a run: an elastic run changes size at its next commit; a preemption or a
    revoke with a grace period (`graceful`) stops at the next commit of a function that commits
    (`commits`), and one that never commits stops now, freeing the GPUs at once."""
    if kind.is_resize:
        return NoticeResponse.RESIZE_AT_COMMIT
    if kind in (NoticeKind.PREEMPT, NoticeKind.REVOKE) and graceful and commits:
        return NoticeResponse.STOP_AT_COMMIT
    return NoticeResponse.STOP_NOW
