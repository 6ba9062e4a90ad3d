"""How an attempt ended, as a value the controller matches on (STYLE item 10).

The follower (follower.py) returns one of these; the controller (controller.py) decides what
comes next: return the value, restart from the last commit, change size, or raise the error the
user sees. Only the user's own stop (KeyboardInterrupt, RunCancelled) still arrives as an
exception, since it comes from outside the attempt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from ...broker.protocol.notice import Notice
from ...errors import GPUSessionError, LaunchRefused, RunTimeout, WorkerFailed
from ..policies import Fault


@dataclass(frozen=True)
class Finished:
    """Every rank returned: rank -> its value as sent (messages.Pickled or BulkValue; None: no value)."""

    results: dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """A rank failed (its root cause): `fault` for the failure policy, `error` for the user."""

    fault: Fault
    error: WorkerFailed | LaunchRefused  # LaunchRefused: a node's launcher would not start the user's rank


@dataclass(frozen=True)
class Resize:
    """An elastic run changes size at this commit (or at the broker's deadline without one)."""

    notice: Notice


@dataclass(frozen=True)
class Stopped:
    """The broker took the lease back (preempted or revoked): `error` is Preempted or LeaseRevoked."""

    error: GPUSessionError


@dataclass(frozen=True)
class TimedOut:
    """The run went past its `timeout`."""

    error: RunTimeout


AttemptEnd = Union[Finished, Failed, Resize, Stopped, TimedOut]
