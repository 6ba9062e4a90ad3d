"""Elastic runs: the run changes size when the broker asks (a shrink notice) or offers (free GPUs
to grow back on).

The follower (follower.py) asks the ranks to commit (gs.should_checkpoint() turns true) and
returns a Resize end at the next commit; the controller stops the ranks, `carry_out` re-makes the
lease's placement group at the new size and tells the broker, and the next attempt starts from
that commit at the new world size. The decision and the cell's line are pure (`decide`,
`resize_line`, tested in tests/unit/test_elastic.py); resizes never count as failures.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ...broker.protocol.notice import Notice, NoticeKind
from ...errors import GPUSessionError, Preempted
from .notices import notice_error

log = logging.getLogger("gpusession")
SHRINK_MARGIN_S = 2.0  # a run that has not committed this long before a shrink's deadline resizes anyway


@dataclass(frozen=True)
class ResizeDecision:
    workers: int  # the size the run takes; equal to the current one: it stays
    why: str


def decide(notice: Notice, *, current: int, minimum: int, full: int) -> ResizeDecision:
    """PURE: the size to take for a shrink notice or an offer to grow: never below `minimum`
    (min_gpus), never above `full` (gpus), and a shrink never grows the run."""
    target = int(notice.to_workers)
    if notice.kind is NoticeKind.SHRINK:
        workers = max(minimum, min(current, target))
        return ResizeDecision(workers, f"told to shrink to {target} workers")
    if notice.kind is NoticeKind.GROW:
        workers = max(current, min(full, target))
        return ResizeDecision(workers, f"offered {target} workers")
    raise ValueError(f"not a resize notice: {notice.kind.value!r}")


def deadline_to_act(notice: Notice, *, received: float) -> float:
    """PURE: when the run changes size even without a commit (a shrink must be made before the
    broker's deadline), or gives up an offer to grow that it did not take in time."""
    period = max(0.0, notice.deadline - received)
    return notice.deadline - min(SHRINK_MARGIN_S, period / 2)


def resize_line(notice: Notice, *, old_gpus: float, new_gpus: float, full_gpus: float, at: str | None) -> str:
    """PURE: the cell's line, e.g. "preempted by lease 12 (alice, high): 4 -> 2 GPUs from the
    checkpoint after step 340" or "4 GPUs again from the checkpoint after step 610" (`at`: where
    the run goes on, as in a restart's line); `at` None: a held lease resized between runs."""
    when = f"from {at}" if at is not None else "between runs"
    if notice.kind is NoticeKind.SHRINK:
        by = notice.by
        who = f"lease {by.get('lease_id')} ({by.get('user')}, {by.get('priority')})" if by else "the broker"
        return f"preempted by {who}: {old_gpus:g} -> {new_gpus:g} GPUs {when}"
    if new_gpus >= full_gpus:
        return f"{new_gpus:g} GPUs again {when}"
    return f"free GPUs offered back: {old_gpus:g} -> {new_gpus:g} GPUs {when}"


def carry_out(lease, notice: Notice) -> tuple[int, int] | None:
    """Make the resize on the lease (its ranks are stopped): (old, new) workers, or None when
    nothing changed (the offer was taken back before the run could take it)."""
    from ...broker import client

    options = lease.options.lease
    decision = decide(notice, current=lease.size, minimum=options.min_workers or lease.size, full=options.workers)
    broker, auth, old = client.broker(), client.lease_auth(lease.identity), lease.size
    if notice.kind is NoticeKind.GROW:
        try:  # first take the offer: from then on the broker holds those GPUs for this lease
            taken = client.call(broker.resize, lease.lease_id, decision.workers, None, auth=auth)
            lease.avoid_nodes(taken.get("avoid_nodes"))
        except GPUSessionError as exc:  # it lapsed, or a shrink notice replaced it
            log.info("Lease %s: the offer to grow was gone (%s)", lease.lease_id, exc)
            return None
    if decision.workers != old:
        lease.change_size(decision.workers)
    try:  # a shrink is made now; a grow says where the regrown group landed
        client.call(broker.resize, lease.lease_id, decision.workers, lease.node_workers(), gpu_ids=lease.gpu_ids(),
                    auth=auth)
    except GPUSessionError as exc:
        if notice.kind is NoticeKind.SHRINK:  # too late: the broker took the whole lease back
            raise Preempted(f"Lease {lease.lease_id} was {notice.reason} and could not shrink in time "
                            f"({exc}). The run stopped at its last checkpoint (last_run.checkpoint); "
                            ".resume() continues from it.") from None
        raise
    log.info("Lease %s: %s; now %d workers (was %d)", lease.lease_id, decision.why, decision.workers, old)
    return old, decision.workers


def resize_between_runs(lease, notice: Notice) -> None:
    """A held lease (gs.lease) with no run going: resize at once, nothing to commit. Counted in
    the lease's RunInfo (resizes, and the next run's transitions) like a resize during a run."""
    sizes = carry_out(lease, notice)
    lease.rearm()
    if sizes is None:
        return
    gpw = lease.options.lease.gpus_per_worker
    line = resize_line(notice, old_gpus=sizes[0] * gpw, new_gpus=sizes[1] * gpw, full_gpus=lease.options.lease.gpus,
                       at=None)
    lease.info.gpus, lease.info.workers = lease.gpus, lease.workers
    lease.info.resizes += 1
    lease.info.transitions.append(line)
    lease.lines_between_runs.append(line)  # the next run's RunInfo starts with them
    log.info("Lease %s: %s", lease.lease_id, line)


def shrink_after_host_loss(lease, workers: int) -> None:
    """An elastic run lost a host: its lease becomes the `workers` that survived (their GPUs, on
    the hosts that remain), re-made as a group of that size, and the broker is told. Not a
    preemption: no notice came; the GPUs of the lost host return to nobody until it answers."""
    from ...broker import client

    lease.change_size(workers)
    client.call(client.broker().resize, lease.lease_id, workers, lease.node_workers(), gpu_ids=lease.gpu_ids(),
                auth=client.lease_auth(lease.identity))
    log.info("Lease %s: a host was lost; going on with the %d workers that remain", lease.lease_id, workers)


def check_between_runs(lease) -> None:
    """Before a run of a held lease: make a resize the broker asked for; if it took the lease
    back, release it and raise what the caller is told."""
    notice = lease.notice()
    if notice is not None and notice.kind.is_resize:
        resize_between_runs(lease, notice)
        return
    if notice is not None:
        error = notice_error(lease, notice)
        lease.release(notice.reason_code or "revoked")
        raise error
