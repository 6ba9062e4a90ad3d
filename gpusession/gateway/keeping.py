"""PURE: the rules of detached runs (issue 32): their time limit, what the gateway keeps of them
and for how long, and the checks of the messages that name them. No I/O, no clock of its own
(every decision takes `now`), so the rules are tested alone.

A detached run is hosted by the gateway whether or not a kernel is connected to it; it ends when
its function ends, when it is cancelled, or when its time limit (`max_duration`) passes. What it
leaves (result bytes as its rank pickled them, metrics, output, receipt) stays in the gateway's
memory for RETENTION_S after it ended, then goes; a result over RESULT_CAP_BYTES is not kept (the
run is told as failed with ResultTooLarge). Nothing survives a restart of the gateway.
"""
from __future__ import annotations

import math
import re
from numbers import Real
from typing import Any

from ..errors import ResultTooLarge  # noqa: F401 - a detached run whose result is over RESULT_CAP_BYTES ends with it
from .runwire import BadRunMessage

DEFAULT_MAX_DURATION_S = 24 * 3600.0  # a detached run's time limit unless the call names one
MAX_MAX_DURATION_S = 30 * 24 * 3600.0  # the longest limit a call may ask for
RETENTION_S = 7 * 24 * 3600.0  # how long an ended run's result, metrics, output and receipt are kept
RESULT_CAP_BYTES = 512 * 2**20  # the largest result (all its frames) the gateway keeps for a run
MAX_EVENTS = 20_000  # events kept for replay per run (outputs beyond it are dropped, reports are kept)
RUNS_PER_USER = 64  # ended runs an account keeps; the oldest ended ones go first
RESULT_BYTES_PER_USER = 2 * 2**30  # the results an account's ended runs keep in all; the oldest go first
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def max_duration_of(value: Any, *, where: str = "max_duration") -> float:
    """The time limit (seconds) of a detached run, or ValueError naming the field and the fix."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{where} must be a number of seconds (a detached run needs a finite time limit; "
                         f"the default is {DEFAULT_MAX_DURATION_S:g} s); got {type(value).__name__}.")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where} must be a finite number of seconds above 0: a detached run needs a time limit "
                         f"(the default is {DEFAULT_MAX_DURATION_S:g} s = 24 h); got {value!r}.")
    if value > MAX_MAX_DURATION_S:
        raise ValueError(f"{where} is at most {MAX_MAX_DURATION_S:g} s (30 days); got {value:g}. Checkpoint the run "
                         "and resume it in a new one for longer.")
    return value


def detach_from_json(data: Any) -> float | None:
    """The `detach` field of a run message: null (not detached) or {max_duration}; its limit."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise BadRunMessage("detach must be null or an object {max_duration}")
    try:
        return max_duration_of(data.get("max_duration"), where="detach.max_duration")
    except ValueError as exc:
        raise BadRunMessage(str(exc)) from None


def run_id_of(value: Any) -> str:
    """A run id as a message carries it (BadRunMessage otherwise)."""
    if not isinstance(value, str) or not RUN_ID.match(value):
        raise BadRunMessage("run_id must be the id gs.runs(all=True) shows (32 hexadecimal digits)")
    return value


def over_time(started_at: float, max_duration_s: float, now: float) -> bool:
    """Whether a detached run has reached its time limit (counted from its submission)."""
    return now >= started_at + max_duration_s


def expired(ended_at: float | None, now: float, retention_s: float = RETENTION_S) -> bool:
    """Whether an ended run's records are past their retention (a live run never expires)."""
    return ended_at is not None and now >= ended_at + retention_s


def expires_at(started_at: float, max_duration_s: float, ended_at: float | None,
               retention_s: float = RETENTION_S) -> float:
    """When the run's records go: RETENTION_S after its end (a live run: after its latest end)."""
    return (ended_at if ended_at is not None else started_at + max_duration_s) + retention_s


def result_refusal(size: int, cap: int = RESULT_CAP_BYTES) -> str | None:
    """Why a result of `size` bytes is not kept, or None."""
    if size <= cap:
        return None
    return (f"The detached run's result is {size / 2**20:.1f} MiB; the gateway keeps at most {cap / 2**20:.0f} MiB "
            "per run. Save large results to a file (or gs.save_checkpoint) and return its path.")


def to_evict(ended: list[tuple[float, str, int]], keep: int = RUNS_PER_USER,
             max_bytes: int = RESULT_BYTES_PER_USER) -> list[str]:
    """Which ended runs (ended_at, id, result bytes) an account drops to keep at most `keep` of
    them and at most `max_bytes` of results in all: the oldest ends first (the newest stays)."""
    ordered = sorted(ended)
    drop = ordered[:max(0, len(ordered) - keep)]
    rest = ordered[len(drop):]
    total = sum(size for _, _, size in rest)
    for item in rest[:-1]:
        if total <= max_bytes:
            break
        drop.append(item)
        total -= item[2]
    return [run_id for _, run_id, _ in drop]


def keeps_event(event: str, kept: int, limit: int = MAX_EVENTS) -> bool:
    """Whether a run that has kept `kept` events keeps this one for replay: past the limit only
    what the state and metrics need (outputs are dropped)."""
    return kept < limit or event != "output"


def may_see(owner: str, user: str) -> bool:
    """Listing and attaching: an account's own runs only."""
    return owner == user


def may_cancel(owner: str, user: str, admin: bool) -> bool:
    """Cancelling: the owner, or an admin of the gateway."""
    return owner == user or admin
