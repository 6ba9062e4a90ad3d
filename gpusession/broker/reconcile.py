"""PURE: compare the ledger's open leases with a snapshot of Ray and say what must change.

Ghost leases are what blocks a shared queue, so every way a caller can vanish is covered: a
placed lease whose group is gone (the kernel died and Ray removed its group), a grant nobody
claimed, a queued request whose caller stopped polling or whose Ray job is dead, a notice whose
grace period ran out, and a run that outlived its declared timeout.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rayview import Snapshot

RUN_DEADLINE_SLACK_S = 60.0  # setup time on top of a run's timeout before the broker steps in


@dataclass(frozen=True)
class Timeouts:
    claim_s: float = 15.0  # a grant whose group was never created expires after this
    heartbeat_s: float = 5.0  # a queued request whose caller stopped polling is dropped after this
    vanish_s: float = 0.4  # a placed lease whose group is missing this long is closed


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
class MarkVanished:
    lease_id: int
    since: float


Action = Close | MarkPlaced | Force | MarkVanished


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


def _reconcile_one(row, snapshot, now, last_seen, vanished_since, timeouts) -> list[Action]:
    lease_id, state = row["id"], row["state"]
    group = snapshot.groups.get(lease_id)
    if state == "queued":
        if row.get("job_id") in snapshot.dead_jobs:
            return [Close(lease_id, "caller gone", now)]
        if now - last_seen.get(lease_id, now) > timeouts.heartbeat_s:
            return [Close(lease_id, "caller gone", now)]
        return []
    notice = row.get("notice") or {}
    if notice.get("deadline") is not None and now >= notice["deadline"]:
        return [Force(lease_id, notice.get("reason_code", "revoked"))]
    if row.get("max_hold_s") and row.get("granted_at") is not None:
        if now > row["granted_at"] + row["max_hold_s"] + RUN_DEADLINE_SLACK_S:
            return [Force(lease_id, "timeout")]
    if group is not None and group.state == "CREATED":
        if state == "granted":
            return [MarkPlaced(lease_id, group.node_workers)]
        return []
    if state == "granted":
        if group is not None and group.state != "REMOVED":
            return []  # Ray is still placing it
        if row.get("job_id") in snapshot.dead_jobs:
            return [Close(lease_id, "caller gone", now)]
        if now - row["granted_at"] > timeouts.claim_s:
            return [Force(lease_id, "expired")]
        return []
    if group is not None and group.state != "REMOVED":
        return []  # RESCHEDULING after a node loss: the run itself will notice
    # placed, but its group is missing or removed
    since = vanished_since.get(lease_id)
    if since is None:
        return [MarkVanished(lease_id, now)]
    if now - since >= timeouts.vanish_s:
        ended = snapshot.dead_jobs.get(row.get("job_id"))  # the kernel's real death, if Ray knows it
        return [Close(lease_id, "caller gone", min(since, ended) if ended else since)]
    return []
