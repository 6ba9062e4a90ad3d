"""PURE: compare the ledger's open leases with a snapshot of Ray and say what must change.

Ghost leases are what blocks a shared queue, so every way a caller can vanish is covered: a
placed lease whose group is gone (the kernel died and Ray removed its group), a grant nobody
claimed, a queued request whose Ray job is dead or whose caller stopped polling, a notice whose
grace period ran out, and a run that outlived its declared timeout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocol.notice import NoticeKind, kind_of
from ..policy.states import LeaseState
from ...cluster.placement import PlacementState

if TYPE_CHECKING:  # the decisions here are pure: they take a snapshot, and never import Ray
    from .rayview import Snapshot

# The caller enforces a run's timeout itself; the broker steps in only for a caller that failed to,
# counting from the placement with room for setup (worker start, a runtime_env's pip install).
RUN_DEADLINE_SLACK_S = 600.0

# A queued request whose caller Ray lists as a running job is not dropped for a short silence:
# that job's death closes it at once (dead_jobs), and a live caller's next poll can come seconds
# late on a loaded machine (seen: at load average 22, 7 of 96 queued requests of 8 live threads
# closed as "caller gone" with the 3 s heartbeat). Only a caller that has polled for none of this
# long is taken for hung; a forged or unknown job id gets the plain heartbeat. A hung caller's
# request costs little meanwhile: if it is granted, the claim timeout takes the GPUs back.
LIVE_CALLER_SILENCE_S = 60.0


@dataclass(frozen=True)
class Timeouts:
    claim_s: float = 15.0  # a grant whose group was never created expires after this
    heartbeat_s: float = 5.0  # a queued request whose caller stopped polling is dropped after this
    # (LIVE_CALLER_SILENCE_S instead, when Ray lists the caller's job as running)
    # A placed lease whose group is gone while its caller lives: the caller is probably releasing
    # (it waits up to 5 s for Ray's view before telling the broker), so give it longer than that.
    vanish_s: float = 10.0


@dataclass(frozen=True)
class Close:
    lease_id: int
    reason: str
    released_at: float


@dataclass(frozen=True)
class MarkPlaced:
    lease_id: int
    node_workers: dict[str, int]


@dataclass(frozen=True)
class Force:
    """Take a lease's GPUs back now: remove its group, kill its workers, close its row."""

    lease_id: int
    reason: str


@dataclass(frozen=True)
class Withdraw:
    """An offer of GPUs (to an elastic lease that shrank) was not taken in time: take it back."""

    lease_id: int


@dataclass(frozen=True)
class MarkVanished:
    lease_id: int
    since: float


Action = Close | MarkPlaced | Force | MarkVanished | Withdraw


def reconcile(
    rows: list[dict],
    snapshot: Snapshot,
    *,
    now: float,
    last_seen: dict[int, float],
    vanished_since: dict[int, float],
    timeouts: Timeouts = Timeouts(),
) -> list[Action]:
    actions: list[Action] = []
    for row in rows:
        actions.extend(_reconcile_one(row, snapshot, now, last_seen, vanished_since, timeouts))
    return actions


def allowed_silence(job_id: str | None, snapshot: Snapshot, timeouts: Timeouts) -> float:
    """PURE: how long a queued request's caller may go without polling before it is dropped."""
    if job_id is not None and job_id in snapshot.live_jobs:
        return max(timeouts.heartbeat_s, LIVE_CALLER_SILENCE_S)
    return timeouts.heartbeat_s


def _reconcile_one(row, snapshot, now, last_seen, vanished_since, timeouts) -> list[Action]:
    lease_id, state = row["id"], row["state"]
    group = snapshot.groups.get(lease_id)
    if state == LeaseState.QUEUED:
        if row.get("job_id") in snapshot.dead_jobs:
            return [Close(lease_id, "caller gone", now)]
        silence = now - last_seen.get(lease_id, now)
        if silence > allowed_silence(row.get("job_id"), snapshot, timeouts):
            return [Close(lease_id, "caller gone", now)]
        return []
    notice = row.get("notice") or {}
    if notice.get("deadline") is not None and now >= notice["deadline"]:
        if kind_of(notice) is NoticeKind.GROW:
            return [Withdraw(lease_id)]
        # a shrink that was not made in time ends like a preemption: Ray cannot shrink a group
        return [Force(lease_id, notice.get("reason_code", "revoked"))]
    held_since = row.get("placed_at") or row.get("granted_at")
    if row.get("max_hold_s") and held_since is not None:
        if now > held_since + row["max_hold_s"] + RUN_DEADLINE_SLACK_S:
            return [Force(lease_id, "timeout")]
    if group is not None and group.state == PlacementState.CREATED:
        if state == LeaseState.GRANTED:
            return [MarkPlaced(lease_id, group.node_workers)]
        return []
    if state == LeaseState.GRANTED:
        if group is not None and group.state != PlacementState.REMOVED:
            return []  # Ray is still placing it
        if row.get("job_id") in snapshot.dead_jobs:
            return [Close(lease_id, "caller gone", now)]
        if now - row["granted_at"] > timeouts.claim_s:
            return [Force(lease_id, "expired")]
        return []
    if group is not None and group.state != PlacementState.REMOVED:
        return []  # RESCHEDULING after a node loss: the run itself will notice
    # placed, but its group is missing or removed
    ended = snapshot.dead_jobs.get(row.get("job_id"))
    if ended is not None:  # the kernel died and Ray removed its group: close at its real end
        since = vanished_since.get(lease_id, now)
        return [Close(lease_id, "caller gone", min(since, ended) if ended else since)]
    since = vanished_since.get(lease_id)
    if since is None:
        return [MarkVanished(lease_id, now)]
    if now - since >= timeouts.vanish_s:
        return [Close(lease_id, "lost", since)]  # removed under a living caller that never said
    return []
