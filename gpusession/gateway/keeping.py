"""PURE: the rules of detached runs (issue 32): their time limit, what the gateway keeps of them
and for how long, and the checks of the messages that name them. No I/O, no clock of its own
(every decision takes `now`), so the rules are tested alone.

A detached run is hosted by the gateway whether or not a kernel is connected to it; it ends when
its function ends, when it is cancelled, or when its time limit (`max_duration`) passes. What it
leaves (result bytes as its rank pickled them, metrics, output, receipt) stays in the gateway's
memory for its retention after it ended, then goes; a result over RESULT_CAP_BYTES is not kept
(the run is told as failed with ResultTooLarge). Nothing survives a restart of the gateway.
Its events for replay are bounded (History): its own few (queued, granted, running, transitions)
and the latest MAX_EVENTS reports and output lines, at most MAX_EVENT_BYTES of them; older ones
go, and an attach is told how many went.

The admin sets the default time limit and the retention (DetachPolicy): `gpusession hub
--detach-max-duration 8h --detach-retention 3d`; a user's own gateway takes them from the
kernel that starts it (GPUSESSION_DETACH_MAX_DURATION, GPUSESSION_DETACH_RETENTION).
"""
from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping

from ..errors import ResultTooLarge  # noqa: F401 - a detached run whose result is over RESULT_CAP_BYTES ends with it
from ..run.caller.options import parse_duration
from .runwire import BadRunMessage
from .kinds import Event

DEFAULT_MAX_DURATION_S = 24 * 3600.0  # a detached run's time limit unless the call names one (out of the box)
MAX_MAX_DURATION_S = 30 * 24 * 3600.0  # the longest limit a call (or an admin's default) may ask for
RETENTION_S = 7 * 24 * 3600.0  # how long an ended run's result, metrics, output and receipt are kept (out of the box)
MIN_RETENTION_S, MAX_RETENTION_S = 60.0, 365 * 24 * 3600.0  # what an admin may set
MAX_DURATION_ENV, RETENTION_ENV = "GPUSESSION_DETACH_MAX_DURATION", "GPUSESSION_DETACH_RETENTION"
RESULT_CAP_BYTES = 512 * 2**20  # the largest result (all its frames) the gateway keeps for a run
MAX_EVENTS = 20_000  # a run's reports and output lines kept for replay: the latest (older ones go)
MAX_EVENT_BYTES = 64 * 2**20  # ... and at most this many bytes of them in all (one report may be 16 MB)
RANK_EVENTS = (Event.OUTPUT, Event.REPORT)  # what the run's ranks send: bounded; the rest, a handful
RUNS_PER_USER = 64  # ended runs an account keeps; the oldest ended ones go first
RESULT_BYTES_PER_USER = 2 * 2**30  # the results an account's ended runs keep in all; the oldest go first
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class Detach:
    """A run to be hosted by a gateway past its kernel: its time limit in seconds, or None when the
    call named none (the gateway then applies its admin's default)."""

    max_duration_s: float | None = None

    def as_json(self) -> dict:
        return {"max_duration": self.max_duration_s}


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


@dataclass(frozen=True)
class DetachPolicy:
    """What the admin sets for detached runs: the time limit of one that names none, and how long
    an ended one's records are kept."""

    default_max_duration_s: float = DEFAULT_MAX_DURATION_S
    retention_s: float = RETENTION_S


def detach_policy(max_duration: Any = None, retention: Any = None, *,
                  names: tuple[str, str] = ("--detach-max-duration", "--detach-retention")) -> DetachPolicy:
    """The policy from an admin's values (seconds, or "8h", "3d"; None: out of the box), or
    ValueError naming the option (`names`) and what it takes."""
    policy = DetachPolicy()
    limit, keep = policy.default_max_duration_s, policy.retention_s
    if max_duration is not None:
        limit = max_duration_of(_seconds(max_duration, names[0]), where=names[0])
    if retention is not None:
        keep = _seconds(retention, names[1])
        if not MIN_RETENTION_S <= keep <= MAX_RETENTION_S:
            raise ValueError(f"{names[1]} is how long an ended detached run's result, metrics and output are kept: "
                             f"from {MIN_RETENTION_S:g} s to {MAX_RETENTION_S / 86400:g} days (e.g. 3d); got {retention!r}.")
    return DetachPolicy(limit, keep)


def detach_policy_from_env(env: Mapping[str, str]) -> DetachPolicy:
    """A user's own gateway's policy: the variables of the kernel that started it (the user is
    their own admin); ValueError naming the variable."""
    return detach_policy(env.get(MAX_DURATION_ENV) or None, env.get(RETENTION_ENV) or None,
                         names=(MAX_DURATION_ENV, RETENTION_ENV))


def _seconds(value: Any, name: str) -> float:
    try:
        return parse_duration(value, field_name=name)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a time above 0, in seconds or such as 90s, 10m, 8h, 3d; got {value!r}.") from None


def detach_from_json(data: Any, default_s: float = DEFAULT_MAX_DURATION_S) -> float | None:
    """The `detach` field of a run message: null (not detached) or {max_duration}, whose null is
    the gateway's default (`default_s`); the run's limit."""
    if data is None:
        return None
    if not isinstance(data, dict) or "max_duration" not in data:
        raise BadRunMessage("detach must be null or an object {max_duration} (null: the gateway's default)")
    if data["max_duration"] is None:
        return default_s
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


class History:
    """PURE: the events a detached run keeps for replay, in their order: every one but the ranks'
    (queued, granted, running, transitions: a handful per run) and the latest of the ranks'
    (RANK_EVENTS), at most `limit` of those and `max_bytes` of them in all (`size`: an event's
    bytes as sent); `dropped` counts the ranks' events that went, oldest first."""

    def __init__(self, limit: int = MAX_EVENTS, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self.limit, self.max_bytes = limit, max_bytes
        self.dropped = 0
        self._older: list = []  # events of the run's own that came before everything in _recent
        self._recent: deque = deque()  # (fields, size or None for the run's own)
        self._count = self._bytes = 0

    def add(self, fields: dict, size: int) -> None:
        ranks = fields.get("event") in RANK_EVENTS
        self._recent.append((fields, size if ranks else None))
        if ranks:
            self._count, self._bytes = self._count + 1, self._bytes + size
        while self._count > self.limit or self._bytes > self.max_bytes:
            old, old_size = self._recent.popleft()
            if old_size is None:
                self._older.append(old)
            else:
                self._count, self._bytes, self.dropped = self._count - 1, self._bytes - old_size, self.dropped + 1

    def events(self) -> list[dict]:
        return self._older + [fields for fields, _ in self._recent]

    def __len__(self) -> int:
        return len(self._older) + len(self._recent)


def may_see(owner: str, user: str) -> bool:
    """Listing and attaching: an account's own runs only."""
    return owner == user


def may_cancel(owner: str, user: str, admin: bool) -> bool:
    """Cancelling: the owner, or an admin of the gateway."""
    return owner == user or admin
