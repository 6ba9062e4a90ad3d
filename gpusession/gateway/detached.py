"""The detached runs the gateway hosts (issue 32), service side: each run's record (its events for
replay, its end, the kernels following it) and the registry of them per account, in memory.

A detached run's events go to every kernel attached to it (the one that started it first); a
kernel attaching later is sent the events so far, then the live ones, then the end. A kernel
that goes away only stops following; the run goes on until its function ends, a cancel, or its
time limit. The result's bytes are kept as the rank pickled them (never unpickled here).

In memory only: a restart of the gateway loses every record (keeping.py has the rules).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import QuotaExceeded, RunTimeout
from ..run.endings import EndReason
from . import keeping
from .chunks import send_chunked
from .frames import Connection
from .kinds import DetachedState, Event, Kind

log = logging.getLogger("gpusession.gateway")
MAX_PENDING = keeping.MAX_EVENTS + 1000  # unsent messages past which a following kernel is dropped
FLUSH_S = 30.0  # how long a session waits for its kernel to be sent the end before it closes
# runs of one account not yet ended (queued or running): each holds threads of the gateway and a
# request at the broker; past it the next detach is refused, so a loop of submits cannot exhaust them
LIVE_RUNS_PER_USER = 100

_STATE_OF_EVENT = {Event.QUEUED: DetachedState.QUEUED, Event.GRANTED: DetachedState.STARTING,
                   Event.RUNNING: DetachedState.RUNNING, Event.TRANSITION: DetachedState.STARTING}
_STATE_OF_END = {EndReason.FINISHED: DetachedState.FINISHED,
                 EndReason.CANCELLED: DetachedState.CANCELLED}  # any other end reason: failed


class Follower:
    """One kernel following a run. What it is sent goes through a queue that a thread of its own
    empties, so a kernel that reads slowly (or not at all) never holds up the run; past MAX_PENDING
    unsent messages it is dropped (its connection closed: it may attach again)."""

    def __init__(self, conn: Connection, max_pending: int = MAX_PENDING) -> None:
        self.conn, self.max_pending = conn, max_pending
        self.dropped = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._send_all, name="gpusession-gateway-follower", daemon=True)
        self._thread.start()

    def put(self, item: tuple) -> bool:
        """(Kind.EVENT, fields) or (Kind.DONE, fields, frames); False once dropped."""
        with self._lock:
            if self.dropped:
                return False
            if self._pending >= self.max_pending:
                self._drop_locked("it read nothing while %d messages waited" % self._pending)
                return False
            self._pending += 1
        self._queue.put(item)
        return True

    def stop(self) -> None:
        """Nothing more is sent after what is queued (the kernel left, or stopped following)."""
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the end was sent (or the kernel dropped); whether it was."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _drop_locked(self, why: str) -> None:
        if not self.dropped:
            self.dropped = True
            log.info("a kernel following a detached run was dropped: %s", why)
            self.conn.close()
            self._queue.put(None)

    def _send_all(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if item[0] is Kind.DONE:
                    send_chunked(self.conn, Kind.DONE, list(item[2]), **item[1])
                    return
                self.conn.send(Kind.EVENT, **item[1])
            except Exception as exc:  # noqa: BLE001 - OSError, FrameError: this kernel is gone
                with self._lock:
                    self._drop_locked(f"{type(exc).__name__}: {exc}")
                return
            finally:
                with self._lock:
                    self._pending -= 1


@dataclass
class HostedRun:
    run_id: str
    user: str
    name: str
    gpus: float
    workers: int
    max_duration_s: float
    notebook: str | None = None  # the submitting kernel's notebook, when it knew it
    retention_s: float = keeping.RETENTION_S  # how long its records stay after it ended (the registry's)
    started_at: float = field(default_factory=time.time)
    state: DetachedState = DetachedState.SUBMITTED
    ended_at: float | None = None
    end_reason: EndReason | None = None
    history: keeping.History = field(default_factory=keeping.History)  # the event messages' fields, for replay
    reports: int = 0  # the reports its rank 0 made (kept for replay or not)
    done: tuple | None = None  # (fields, frames) of the `done` message
    result_bytes: int = 0
    stop_error: BaseException | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _subscribers: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ----- the run's side ---------------------------------------------------------------------------
    def publish(self, fields: dict) -> None:
        """One event: recorded (keeping.History: the latest) and sent to every following kernel."""
        size = len(json.dumps(fields, default=str)) if fields.get("event") in keeping.RANK_EVENTS else 0
        with self._lock:
            event = fields.get("event", "")
            self.state = _STATE_OF_EVENT.get(event, self.state)
            self.reports += event == Event.REPORT
            self.history.add(fields, size)
            self._subscribers = [f for f in self._subscribers if f.put((Kind.EVENT, fields))]

    def check(self, now: float) -> None:
        """The run's poll: a cancel, or the time limit, ends it."""
        if self.stop_error is not None:
            raise self.stop_error
        if keeping.over_time(self.started_at, self.max_duration_s, now):
            self.request_stop(RunTimeout(
                f"The detached run {self.run_id} ({self.name}) reached its max_duration of {self.max_duration_s:g} s; "
                "every worker was stopped and its GPUs released. Ask for a longer max_duration in submit()."))
            raise self.stop_error

    def finish(self, fields: dict, frames: list, end_reason: EndReason) -> None:
        """The run ended: its end kept and sent to every following kernel."""
        with self._lock:
            self.ended_at = time.time()
            self.end_reason = end_reason
            self.state = DetachedState.FAILED if fields.get("error") is not None and end_reason == EndReason.FINISHED \
                else _STATE_OF_END.get(end_reason, DetachedState.FAILED)  # a result too large to keep: failed
            self.done = (fields, list(frames))
            self.result_bytes = value_size(frames)
            for follower in self._subscribers:
                follower.put((Kind.DONE, fields, self.done[1]))
            self._subscribers = []
        self.stopping.set()

    # ----- a kernel's side ----------------------------------------------------------------------------
    def request_stop(self, error: BaseException) -> None:
        if self.stop_error is None:
            self.stop_error = error
        self.stopping.set()

    def follow(self, conn: Connection) -> Follower:
        """The connection follows the run: sent the events so far, then the live ones, then the
        end (at once if it came). `Follower.join` waits until the end was sent. What it replays
        begins at the oldest event kept (row()'s "dropped": the ranks' events that went before)."""
        with self._lock:
            events = self.history.events()
            follower = Follower(conn, max_pending=max(MAX_PENDING, len(events) + 1000))
            for fields in events:
                follower.put((Kind.EVENT, fields))
            if self.done is not None:
                follower.put((Kind.DONE, *self.done))
            else:
                self._subscribers.append(follower)
            return follower

    def unfollow(self, conn: Connection) -> None:
        with self._lock:
            for follower in [f for f in self._subscribers if f.conn is conn]:
                follower.stop()
            self._subscribers = [f for f in self._subscribers if f.conn is not conn]

    def row(self) -> dict:
        """What gs.runs(all=True) shows of it."""
        return {"run_id": self.run_id, "name": self.name, "user": self.user, "state": self.state,
                "gpus": self.gpus, "workers": self.workers, "started": self.started_at, "ended": self.ended_at,
                "end_reason": self.end_reason, "max_duration": self.max_duration_s, "notebook": self.notebook,
                "expires": keeping.expires_at(self.started_at, self.max_duration_s, self.ended_at, self.retention_s),
                "reports": self.reports, "dropped": self.history.dropped}


class Registry:
    """The detached runs of every account, by id; ended ones go after the policy's retention (and
    past keeping.RUNS_PER_USER or RESULT_BYTES_PER_USER of an account), checked whenever the
    registry is used; an account has at most live_per_user runs not yet ended. A kept result's
    frames may be views of Ray's object store (pinned there)."""

    def __init__(self, policy: keeping.DetachPolicy = keeping.DetachPolicy(), per_user: int = keeping.RUNS_PER_USER,
                 bytes_per_user: int = keeping.RESULT_BYTES_PER_USER, live_per_user: int = LIVE_RUNS_PER_USER) -> None:
        self.policy, self.per_user, self.bytes_per_user = policy, per_user, bytes_per_user
        self.live_per_user = live_per_user
        self._runs: dict[str, HostedRun] = {}
        self._lock = threading.Lock()

    def add(self, user: str, name: str, gpus: float, workers: int, max_duration_s: float,
            notebook: str | None = None) -> HostedRun:
        """A new run's record; QuotaExceeded (nothing kept) when the account has live_per_user
        runs not yet ended."""
        with self._lock:
            self._sweep(time.time())
            live = sum(1 for run in self._runs.values() if run.user == user and run.ended_at is None)
            if live >= self.live_per_user:
                raise QuotaExceeded(
                    f"The gateway hosts at most {self.live_per_user} detached runs of one account that have not "
                    f"ended, and {user} has {live}; nothing was started. Wait for one to end or cancel one "
                    "(gs.runs(all=True) lists them; gs.attach(run_id).cancel() stops one), then submit again.")
            run = HostedRun(uuid.uuid4().hex, user, name, gpus, workers, max_duration_s,
                            notebook if isinstance(notebook, str) else None, self.policy.retention_s)
            self._runs[run.run_id] = run
        return run

    def get(self, run_id: str) -> HostedRun | None:
        """The run (any account's: the caller checks keeping.may_see / may_cancel)."""
        with self._lock:
            self._sweep(time.time())
            return self._runs.get(run_id)

    def holds_any(self) -> bool:
        """Whether it keeps any run (live, or ended and not yet expired)."""
        with self._lock:
            self._sweep(time.time())
            return bool(self._runs)

    def rows(self, user: str | None) -> list[dict]:
        """An account's runs, newest first; every account's when `user` is None (an admin's list:
        the caller checks that it is one)."""
        with self._lock:
            self._sweep(time.time())
            shown = [run for run in self._runs.values() if user is None or keeping.may_see(run.user, user)]
        return [run.row() for run in sorted(shown, key=lambda run: run.started_at, reverse=True)]

    def _sweep(self, now: float) -> None:
        for run_id in [i for i, run in self._runs.items() if keeping.expired(run.ended_at, now, self.policy.retention_s)]:
            del self._runs[run_id]
        for user in {run.user for run in self._runs.values()}:
            ended = [(run.ended_at, run.run_id, run.result_bytes) for run in self._runs.values()
                     if run.user == user and run.ended_at is not None]
            for run_id in keeping.to_evict(ended, self.per_user, self.bytes_per_user):
                del self._runs[run_id]


REGISTRY = Registry()


def value_size(frames: list[Any]) -> int:
    return sum(memoryview(frame).nbytes for frame in frames)
