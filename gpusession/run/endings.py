"""PURE: what the end of a run is called: the end reason the broker and the receipt record, and
the state the run controller ends in. Apart, so the lease, the controller and the `gs.distributed`
entry point share one mapping."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import LeaseRevoked, Preempted, RunCancelled, RunTimeout
from .policies import RunState


def end_reason(error: BaseException | None) -> str:
    """The end reason of a run (or a lease) that ended with `error` (None: it finished)."""
    if error is None:
        return "finished"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, Preempted):
        return "preempted"
    if isinstance(error, LeaseRevoked):
        return "revoked"
    if isinstance(error, RunCancelled):
        return "cancelled"
    return "timeout" if isinstance(error, RunTimeout) else "failed"


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
