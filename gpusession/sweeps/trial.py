"""One trial's view of its run: the Observer a trial's `gs.distributed` call renders through.

The run loop calls it in the trial's own thread, so raising from `report` (the pruner said
stop) or from `poll` (the sweep was stopped) ends the run the way an interrupt does: every
worker stopped, the GPUs released, and the exception raised out of the call.
"""
from __future__ import annotations

import enum
import threading
import time
from typing import Callable, Protocol

from ..observe.events import Observer, RunInfo
from .records import TrialRecord, TrialState


class Board(Protocol):
    """Where a sweep shows its trials (see view.py)."""

    def changed(self, record: TrialRecord) -> None: ...

    def output(self, record: TrialRecord, rank: int, stream: str, text: str) -> None: ...


class StopReason(str, enum.Enum):
    """Why a sweep stops starting trials: it was interrupted, or too many trials failed."""
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class StopSignal:
    """Set once, from any thread; every trial's poll raises when the sweep was interrupted."""

    def __init__(self) -> None:
        self._reason: StopReason | None = None
        self._lock = threading.Lock()

    @property
    def reason(self) -> StopReason | None:
        return self._reason

    def set(self, reason: StopReason) -> None:
        with self._lock:
            self._reason = self._reason or StopReason(reason)

    def check(self) -> None:
        if self._reason is StopReason.INTERRUPTED:
            raise KeyboardInterrupt("the sweep was stopped")


class TrialObserver(Observer):
    """Feeds rank 0's reports to Optuna (report + should_prune) and keeps the trial's record."""

    def __init__(self, record: TrialRecord, trial, *, objective: str, better: Callable[[float, float], bool],
                 board: Board, stop: StopSignal, optuna_lock: threading.Lock, prune: bool = True) -> None:
        self.record, self.trial, self.objective, self.better = record, trial, objective, better
        self.board, self.stop, self.optuna_lock, self.prune = board, stop, optuna_lock, prune
        self._told_steps: set[int] = set()

    def queued(self, view: dict, elapsed_s: float) -> None:
        state = TrialState.REQUEUED if self.record.preemptions else TrialState.QUEUED
        if self.record.state is not state:
            self.record.state = state
            self.board.changed(self.record)

    def granted(self, info: RunInfo) -> None:
        self.record.state = TrialState.STARTING
        self.board.changed(self.record)

    def running(self, info: RunInfo) -> None:
        self.record.state = TrialState.RUNNING
        self.board.changed(self.record)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.board.output(self.record, rank, stream, text)

    def report(self, metrics: dict, info: RunInfo) -> None:
        value = self.record.add_report(metrics, self.objective, better=self.better)
        self.board.changed(self.record)
        step = self.record.step
        # a run resumed after a preemption repeats the steps since its checkpoint: Optuna keeps
        # the first value of a step, and a step is judged once
        if value is None or step is None or step in self._told_steps:
            return
        self._told_steps.add(step)
        with self.optuna_lock:  # one Optuna call at a time: SQLite storages are not thread-safe
            self.trial.report(value, step)
            prune = self.prune and self.trial.should_prune()
        if prune:
            import optuna

            self.record.pruned_at = time.time()
            raise optuna.TrialPruned(
                f"trial {self.record.number} pruned at step {step} ({self.objective}={value:.4g})")

    def poll(self) -> None:
        self.stop.check()

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        self.record.gpu_seconds += info.gpu_seconds
        self.record.run_s += info.run_s
        if info.lease_id is not None and info.lease_id not in self.record.lease_ids:
            self.record.lease_ids.append(info.lease_id)
        self.record.ended_at = time.time()
