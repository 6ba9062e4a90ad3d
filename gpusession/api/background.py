"""Background runs: `run = train.submit(*args)` returns a `Run` at once while the GPUs train.

A run is one `@gs.distributed` call made in a thread of its own (the same lease, controller and
receipt as a blocking call), seen from the caller's thread through a `Run` handle: its state,
its queue position, its live metrics, its `RunInfo`, and its end as a value or the very
exception a blocking call raises. The thread runs in a copy of the caller's context, so in a
notebook the run's live view and output land in the cell that started it and no other.

`cancel()` asks the run to stop: the run loop polls its observer every 0.2 s while it runs (1 s
while it waits in the queue), and the poll raises `RunCancelled`, which stops every rank and
releases the GPUs exactly as an interrupt does. The stop button (KeyboardInterrupt) reaches only
the kernel's main thread, so it never stops a background run.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import itertools
import threading
import time
from typing import Any, Callable

from ..errors import GPUSessionError, RunCancelled
from ..observe.events import Fanout, Observer, RunInfo
from ..run.caller.kernelcell import mark_background


class RunStatus(enum.Enum):
    """Where a background run is, as its handle shows it."""

    SUBMITTED = "submitted"  # its thread started; not yet at the broker
    QUEUED = "queued"  # waiting for GPUs (`Run.position` says where in the queue)
    STARTING = "starting"  # GPUs granted, workers starting
    RUNNING = "running"  # every rank runs the function
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED)


_MOVES = {
    RunStatus.SUBMITTED: {RunStatus.QUEUED, RunStatus.STARTING, RunStatus.FINISHED, RunStatus.FAILED,
                          RunStatus.CANCELLED},
    RunStatus.QUEUED: {RunStatus.STARTING, RunStatus.FAILED, RunStatus.CANCELLED},
    RunStatus.STARTING: {RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED},
    # a restart or a resize goes back to starting; a preempted run may wait in the queue again
    RunStatus.RUNNING: {RunStatus.STARTING, RunStatus.QUEUED, RunStatus.FINISHED, RunStatus.FAILED,
                        RunStatus.CANCELLED},
}


class IllegalMove(GPUSessionError):
    """A run was told to move between states it cannot (a bug in gpusession, never the user's)."""


def next_status(current: RunStatus, target: RunStatus) -> RunStatus:
    """PURE: `target` if a run may move there from `current`; the same state is no move."""
    if target is current:
        return current
    if target not in _MOVES.get(current, set()):
        raise IllegalMove(f"A run cannot move from {current.value} to {target.value}.")
    return target


def ended_status(error: BaseException | None) -> RunStatus:
    """PURE: the state a run's end leaves it in."""
    if error is None:
        return RunStatus.FINISHED
    if isinstance(error, RunCancelled):
        return RunStatus.CANCELLED
    return RunStatus.FAILED


class _Tracker(Observer):
    """The handle's view of its run, fed by the run loop in the run's thread."""

    def __init__(self, run: "Run") -> None:
        self.run = run

    def queued(self, view: dict, elapsed_s: float) -> None:
        self.run._position = view.get("position")
        self.run._move(RunStatus.QUEUED)

    def granted(self, info: RunInfo) -> None:
        self.run._position = None
        self.run._move(RunStatus.STARTING)

    def running(self, info: RunInfo) -> None:
        self.run._move(RunStatus.RUNNING)

    def transition(self, info: RunInfo, line: str) -> None:
        self.run._move(RunStatus.STARTING)

    def poll(self) -> None:
        if self.run._cancel_asked is not None:
            raise RunCancelled(f"Run {self.run.number} ({self.run.name}) was cancelled with run.cancel(); "
                               "every worker was stopped and its GPUs released.")


class Run:
    """A background run. See `DistributedFunction.submit`.

    In [1]: run = train.submit(0.1)
    In [2]: run.state, run.metrics[-1:]     # while it trains; the notebook stays usable
    In [3]: state = run.result()            # waits; raises the run's error as a blocking call would
    """

    _numbers = itertools.count(1)

    def __init__(self, name: str, start: Callable[[Observer, RunInfo], Any], observer: Observer) -> None:
        self.number = next(Run._numbers)
        self.name = name
        self.info = RunInfo()
        self.submitted_at = time.time()
        self.ended_at: float | None = None
        self._status = RunStatus.SUBMITTED
        self._status_lock = threading.Lock()
        self._position: int | None = None
        self._cancel_asked: float | None = None  # time.monotonic() of the first cancel()
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._future.set_running_or_notify_cancel()
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._main, start, Fanout(_Tracker(self), observer)),
            name=f"gpusession-run-{self.number}", daemon=True)

    def _begin(self) -> "Run":
        _register(self)
        self._thread.start()
        return self

    def _main(self, start: Callable[[Observer, RunInfo], Any], observer: Observer) -> None:
        mark_background()  # its lease request says so (the JupyterLab sidebar labels it)
        try:
            value = start(observer, self.info)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            self._end(exc)
            self._future.set_exception(exc)
        else:
            self._end(None)
            self._future.set_result(value)

    def _end(self, error: BaseException | None) -> None:
        self.ended_at = time.time()
        with self._status_lock:
            self._status = ended_status(error)  # any state may end

    def _move(self, target: RunStatus) -> None:
        with self._status_lock:
            self._status = next_status(self._status, target)

    # ----- public ---------------------------------------------------------------------------------
    @property
    def state(self) -> RunStatus:
        return self._status

    @property
    def position(self) -> int | None:
        """Its place in the broker's queue while it waits for GPUs (1: next), else None."""
        return self._position if self._status is RunStatus.QUEUED else None

    @property
    def metrics(self) -> list[dict]:
        """Rank 0's `gs.report` rows so far (a copy)."""
        return list(self.info.history)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Any:
        """The function's value once the run ends (waits up to `timeout` s; TimeoutError after,
        the run going on). A run that failed raises its error: the same type and traceback as the
        blocking call (WorkerFailed, RunTimeout, Preempted, ...); a cancelled one RunCancelled."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"Run {self.number} ({self.name}) is still {self.state.value} after "
                               f"{timeout:g} s; it goes on. Wait longer, or stop it with run.cancel().") from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def cancel(self) -> bool:
        """Stop the run: every rank stopped and its GPUs released (within a second while it runs;
        a queued run leaves the queue). False if it had already ended."""
        if self.done():
            return False
        if self._cancel_asked is None:
            self._cancel_asked = time.monotonic()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the run ended within `timeout` s; never raises its error."""
        concurrent.futures.wait([self._future], timeout=timeout)
        return self.done()

    def __await__(self):
        return asyncio.wrap_future(self._future).__await__()

    def __repr__(self) -> str:
        state = self.state.value
        if self.position is not None:
            state += f", position {self.position} in the queue"
        if self.info.history:
            state += f", {len(self.info.history)} reports"
        return f"<gpusession.Run {self.number} {self.name}: {state}>"


_runs: list[Run] = []
_runs_lock = threading.Lock()


def _register(run: Run) -> None:
    with _runs_lock:
        _runs.append(run)


def runs(all: bool = False) -> list:  # noqa: A002 - the documented keyword
    """This process's background runs, newest first (ended ones too). all=True: this account's
    detached runs the gpusession gateway keeps, from every kernel (records: run_id, name, state,
    gpus, started, ended, expires; `gs.attach(run_id)` follows one)."""
    if all:
        from ..gateway.reattach import list_runs

        return list_runs()
    with _runs_lock:
        return list(reversed(_runs))


def cancel_all() -> int:
    """Cancel every background run that has not ended; how many were asked."""
    return sum(1 for run in runs() if run.cancel())
