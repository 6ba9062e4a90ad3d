"""Typed messages of a run: rank process -> worker actor -> controller, and back.

The rank process (child.py) sends these over its pipe to its worker actor (worker.py), which
relays them to the controller as items of a Ray streaming generator. Checkpoints and results
travel as pickled bytes, so the actor never unpickles user objects; the caller keeps a
checkpoint in its own object store without unpickling it either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


# ----- rank -> controller ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    """Chunks of the rank's stdout/stderr, in order: [(stream name, text), ...]."""

    chunks: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Report:
    """Rank 0 called gs.report."""

    metrics: dict


@dataclass(frozen=True)
class Started:
    """The rank joined the process group and entered the user's function."""

    at: float
    host: str = ""
    address: str = ""
    pid: int = 0


@dataclass(frozen=True)
class Communication:
    """Rank 0's function returned: what it applied of the run's communication options and the
    bytes it all-reduced per step (comm_options.CommReport); sent before its Result."""

    report: Any


@dataclass(frozen=True)
class CheckpointSaved:
    """Rank 0 committed a checkpoint; the next stream item is its CheckpointData."""

    step: int  # how many checkpoints this attempt has committed, this one included


@dataclass(frozen=True)
class CheckpointData:
    """A committed checkpoint, as the caller keeps it and the next attempt (or resume()) gets it.

    `data` is the pickled state: bytes from the rank; the worker actor wraps them in a numpy
    uint8 array (no copy), which Ray stores out of band, so the caller can map its copy and put
    it in its own object store without unpickling the user's objects."""

    data: Any
    loader_epochs: tuple = ()  # per loader prepared at the attempt's start: the epoch to resume (None: 0)


@dataclass(frozen=True)
class WatchesCheckpoints:
    """Rank 0 called gs.should_checkpoint(): it commits when asked, so a notice to stop waits
    for that commit (until just before the deadline) even if it never committed before."""


@dataclass(frozen=True)
class Result:
    """The function returned; with `has_value` the next stream item is the pickled value, of
    `nbytes` bytes in all (its pickle and its out-of-band buffers)."""

    has_value: bool
    nbytes: int = 0


@dataclass(frozen=True)
class RankError:
    """The rank raised: in user code (`fault=False`) or in a collective whose peer went away
    (`fault=True`, decided by the controller from type and message)."""

    rank: int
    host: str
    type: str
    message: str
    traceback: str
    at: float
    mro: tuple[str, ...] = ()  # qualified names of the exception's classes, for retry_exceptions


@dataclass(frozen=True)
class RankExited:
    """The rank's process ended. `signal` is set when it was killed (SIGKILL by the OOM killer or
    a user, SIGSEGV); `clean` when it ended after reporting its result or error."""

    rank: int
    host: str
    exit_code: int | None
    signal: int | None
    clean: bool
    at: float


@dataclass(frozen=True)
class Pickled:
    """User bytes (a checkpoint or a result) as they travel: pickled once in the rank process.
    With `bulk_sizes`, a result's big buffers wait in its node file (bulk.result_path), in order."""

    data: bytes
    bulk_sizes: tuple = ()


@dataclass(frozen=True)
class BulkValue:
    """A result as the worker actor hands it on: the pickle and its big buffers as arrays, which
    Ray keeps out of band in the object store (one copy); the caller unpickles it."""

    header: bytes
    buffers: tuple


# ----- controller -> rank ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """Everything a fresh rank process needs, sent once over its pipe."""

    spec: Any  # worker.RankSpec
    call: bytes  # cloudpickle of (fn, args, kwargs), protocol 5: big buffers out of band (bulk.py)
    checkpoint: bytes | None  # pickled checkpoint to resume from
    loader_epochs: tuple = ()  # CheckpointData.loader_epochs of that checkpoint
    bulk_path: str = ""  # this node's copy of the call's out-of-band buffers (bulk.node_copy)
    bulk_sizes: tuple = ()  # their lengths, in order


@dataclass(frozen=True)
class ServeStore:
    """Sent instead of a Launch: this fork of the warm parent serves an attempt's rendezvous
    store (TCPStore, the master) on `address`, answers the port it bound, and exits when its pipe
    closes (worker.py: the next attempt, or the actor gone)."""

    address: str
    world_size: int
    timeout_s: float


@dataclass(frozen=True)
class StoreServing:
    """The rendezvous store's answer: the port it bound, or why it could not."""

    port: int = 0
    error: str = ""


@dataclass(frozen=True)
class CheckpointAck:
    """The caller holds its own copy of the checkpoint: gs.save_checkpoint may return."""


@dataclass(frozen=True)
class ShouldCheckpoint:
    """The run is about to change size or stop: commit at the next gs.save_checkpoint.
    `wanted=False` takes it back (an offer to grow lapsed before the run committed)."""

    reason: str = ""
    wanted: bool = True


@dataclass
class Hello:
    """First message of a zygote: it imported what ranks need and is ready to fork."""

    pid: int
    imported: list = field(default_factory=list)
