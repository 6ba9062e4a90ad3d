"""What a caller is told when the broker takes its lease back (a notice, or the lease's end).

Apart from the lease (which hears the notice) and the follower (which acts on it during a run),
so neither imports the other."""
from __future__ import annotations

from ...broker.protocol.notice import Notice, NoticeKind
from ...errors import ERRORS_BY_NAME, GPUSessionError, LeaseRevoked, Preempted
from ..endings import EndReason


def notice_error(lease, notice: Notice, *, checkpointed: bool | None = None) -> GPUSessionError:
    """The error a caller sees when the broker took its lease back. checkpointed: None between
    runs, else whether the stopped run had saved a checkpoint."""
    what = f"Lease {lease.lease_id} ({lease.gpus:g} GPUs)"
    if checkpointed is None:
        then = "Ask for GPUs again with gs.lease(...) or the next call."
    elif checkpointed:
        then = ("The run stopped at its last checkpoint (kept in last_run.checkpoint or _gpu.checkpoint); "
                "a decorated function continues from it with .resume().")
    else:
        then = "The run had saved no checkpoint (gs.save_checkpoint), so it stopped where it was."
    if notice.kind is NoticeKind.PREEMPT:
        return Preempted(f"{what} was {notice.reason}. {then}")
    if notice.kind is NoticeKind.REVOKE:
        return LeaseRevoked(f"{what} was {notice.reason}. The workers were stopped. {then}")
    return LeaseRevoked(f"The broker ended {what}: {notice.reason or 'no reason given'}. "
                        f"The workers were stopped. {then}")


def queue_end_error(view: dict) -> GPUSessionError:
    """The error a caller sees when its request ended while it waited in the queue (`view`: the
    request's view from the broker)."""
    if view.get("end_reason") == EndReason.REJECTED and view.get("error") in ERRORS_BY_NAME:
        return ERRORS_BY_NAME[view["error"]](view.get("message") or "The broker rejected the request.")
    if view.get("end_reason") == EndReason.REVOKED:
        return LeaseRevoked(f"Request {view['lease_id']} was revoked while it waited in the queue.")
    return GPUSessionError(
        f"The broker ended request {view['lease_id']} while it waited ({view.get('end_reason')}). Try again."
    )
