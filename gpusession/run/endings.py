"""PURE: what the end of a run is called: the end reason the broker and the receipt record, and
the state the run controller ends in. Apart, so the lease, the controller and the `gs.distributed`
entry point share one mapping."""
from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import LeaseRevoked, Preempted, RunCancelled, RunTimeout
from .policies import RunState


class EndReason(str, enum.Enum):
    """How a run (or its lease) ended, as the broker's ledger and the receipt record it. The
    broker's own closings ("caller gone", "expired", ...) are free text in the ledger; the two a
    waiting caller tells apart are REJECTED and REVOKED."""
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    PREEMPTED = "preempted"
    REVOKED = "revoked"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    FAILED = "failed"
    REJECTED = "rejected"  # the broker refused the request (a quota, a size no node can hold)

    def __str__(self) -> str:  # "finished" in messages and f-strings, like the plain value
        return self.value

    def __repr__(self) -> str:  # what a notebook shows of run.end_reason: 'finished', as before
        return repr(self.value)


def end_reason(error: BaseException | None) -> EndReason:
    """The end reason of a run (or a lease) that ended with `error` (None: it finished)."""
    if error is None:
        return EndReason.FINISHED
    if isinstance(error, KeyboardInterrupt):
        return EndReason.INTERRUPTED
    if isinstance(error, Preempted):
        return EndReason.PREEMPTED
    if isinstance(error, LeaseRevoked):
        return EndReason.REVOKED
    if isinstance(error, RunCancelled):
        return EndReason.CANCELLED
    return EndReason.TIMEOUT if isinstance(error, RunTimeout) else EndReason.FAILED


@contextmanager
def told_when_ended(info, observer) -> Iterator[None]:
    """Around a run: however it ends, its RunInfo gets the end reason and its observer `finished`
    (with the error that ended it, re-raised)."""
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        info.end_reason = end_reason(error)
        observer.finished(info, error)


def terminal_state(error: BaseException) -> RunState:
    """The state a run ends in when `error` ends it."""
    if isinstance(error, Preempted):
        return RunState.PREEMPTED
    if isinstance(error, (KeyboardInterrupt, LeaseRevoked, RunCancelled)):
        return RunState.STOPPED
    return RunState.FAILED
