"""What a sweep knows about each trial, as plain values: the rows of the live table and of
`result.trials`."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any


class TrialState(str, enum.Enum):
    QUEUED = "queued"  # waiting for GPUs in the broker's queue
    STARTING = "starting"  # granted, workers starting
    RUNNING = "running"
    REQUEUED = "requeued"  # preempted: waiting for GPUs again, to continue from its checkpoint
    COMPLETE = "complete"
    PRUNED = "pruned"  # stopped early by the pruner
    FAILED = "failed"  # raised, or never reported the objective
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C; does not count toward `trials`

    @property
    def is_terminal(self) -> bool:
        return self in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAILED, TrialState.INTERRUPTED)

    @property
    def counts(self) -> bool:
        """Whether a trial in this state uses up one of the sweep's `trials`."""
        return self in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAILED)


def objective_value(metrics: dict, objective: str) -> float | None:
    value = metrics.get(objective)
    if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        return float(value)
    return None


@dataclass
class TrialRecord:
    """One trial: its arguments, what it reported, where it stands and what it cost."""

    number: int
    params: dict[str, Any]
    state: TrialState = TrialState.QUEUED
    value: float | None = None  # the last reported objective (the trial's value once complete)
    best: float | None = None  # the best objective it reported
    step: int | None = None  # the step of the last objective report
    reports: int = 0  # gs.report calls of rank 0, over every attempt
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, objective)
    history: list[dict] = field(default_factory=list)  # every report, over every attempt
    gpu_seconds: float = 0.0
    run_s: float = 0.0  # time the function ran, over every attempt
    lease_ids: list[int] = field(default_factory=list)
    preemptions: int = 0
    error: str | None = None
    pruned_at: float | None = None  # when the pruner decided (time.time())
    ended_at: float | None = None  # when its GPUs were released for the last time
    ran_here: bool = True  # False: a trial of an earlier session, loaded from the storage

    def add_report(self, metrics: dict, objective: str, *, better) -> float | None:
        """Keep a report; returns the objective it carries, if any."""
        self.reports += 1
        self.history.append(dict(metrics))
        value = objective_value(metrics, objective)
        if value is None:
            return None
        step = metrics.get("step")
        self.step = int(step) if isinstance(step, Real) and not isinstance(step, bool) else len(self.curve)
        self.curve.append((self.step, value))
        self.value = value
        if self.best is None or better(value, self.best):
            self.best = value
        return value

    def as_row(self) -> dict:
        """A flat dict (what to_dataframe() makes its rows of)."""
        return {"number": self.number, **{f"params_{k}": v for k, v in self.params.items()},
                "state": self.state.value, "value": self.value, "best": self.best, "step": self.step,
                "reports": self.reports, "gpu_seconds": self.gpu_seconds, "run_s": self.run_s,
                "preemptions": self.preemptions, "error": self.error}


def record_from_frozen(frozen, *, better) -> TrialRecord:
    """A trial of an earlier session, as far as Optuna's storage remembers it."""
    from optuna.trial import TrialState as OptunaState

    state = {OptunaState.COMPLETE: TrialState.COMPLETE, OptunaState.PRUNED: TrialState.PRUNED,
             OptunaState.FAIL: TrialState.FAILED}.get(frozen.state, TrialState.INTERRUPTED)
    if frozen.user_attrs.get("gpusession_state") == TrialState.INTERRUPTED.value:
        state = TrialState.INTERRUPTED
    curve = sorted(frozen.intermediate_values.items())
    values = [v for _, v in curve]
    record = TrialRecord(number=frozen.number, params=dict(frozen.user_attrs.get("gpusession_params", frozen.params)),
                         state=state, curve=list(curve), ran_here=False,
                         gpu_seconds=float(frozen.user_attrs.get("gpusession_gpu_seconds", 0.0)),
                         error=frozen.user_attrs.get("gpusession_error"))
    record.value = frozen.value if frozen.value is not None else (values[-1] if values else None)
    record.step = curve[-1][0] if curve else None
    for value in values + ([record.value] if record.value is not None else []):
        if record.best is None or better(value, record.best):
            record.best = value
    record.reports = int(frozen.user_attrs.get("gpusession_reports", len(curve)))
    return record

