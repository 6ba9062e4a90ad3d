"""PURE: the kinds of gateway messages and of the run events they carry, as Enums.

The wire keeps plain strings (the members are `str`s with the same values, so JSON writes them
as before); `frames.Connection.receive` parses a message's "kind" (and an event's "event") once,
and refuses one it does not know, naming the field. Code then compares members, never strings.
"""
from __future__ import annotations

import enum


class _Text(str, enum.Enum):
    def __str__(self) -> str:  # "run" in messages and f-strings, like the plain value
        return self.value


class Kind(_Text):
    """A gateway message's "kind"."""
    HELLO = "hello"
    WELCOME = "welcome"
    REFUSED = "refused"
    CALL = "call"  # the broker session: a broker call, and its result
    RESULT = "result"
    RUN = "run"  # the run session: a call, its events, its end
    MORE = "more"
    EVENT = "event"
    STOP = "stop"
    DONE = "done"
    FAILED = "failed"
    ERROR = "error"
    LEASE = "lease"  # a held lease: its kernel's runs and release
    RELEASE = "release"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_BYTES = "checkpoint_bytes"
    LIST = "list"  # detached runs: list, attach, cancel
    RUNS = "runs"
    ATTACH = "attach"
    CANCEL = "cancel"
    CANCELLING = "cancelling"


class Event(_Text):
    """The "event" of a run's `event` message (and of a detached run's kept events)."""
    REQUESTING = "requesting"
    QUEUED = "queued"
    GRANTED = "granted"
    OUTPUT = "output"
    REPORT = "report"
    RUNNING = "running"
    TRANSITION = "transition"
    RELEASED = "released"
    DETACHED = "detached"
    ATTACHED = "attached"


class StopReason(_Text):
    """Why a kernel asks the gateway to stop a run (its "stop" message's "reason")."""
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


def parse(enum_type: type[enum.Enum], value: object, *, field: str, error: type[Exception] = ValueError):
    """`value` as a member of `enum_type`; anything else is `error`, naming the field and the value."""
    try:
        return enum_type(value)
    except ValueError:
        known = ", ".join(m.value for m in enum_type)
        raise error(f"a message whose {field!r} is {str(value)[:40]!r}, not one of {known}") from None


class DetachedState(_Text):
    """A detached run's "state" in gs.runs(all=True)."""
    SUBMITTED = "submitted"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"
