"""What `gs.sweep` returns: the best trial, every trial's record, and the Optuna study."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import GPUSessionError
from .records import TrialRecord
from .table import table_html, table_rows, table_text


@dataclass
class BestTrial:
    number: int
    params: dict[str, Any]
    value: float
    result: Any = None  # the trial function's return value (None if it ran before a kernel restart)


@dataclass
class SweepResult:
    best: BestTrial | None
    trials: list[TrialRecord]
    study: Any = field(repr=False)
    objective: str = "value"
    mode_min: bool = True

    def to_dataframe(self):
        """One row per trial (pandas must be installed)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("SweepResult.to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame([record.as_row() for record in self.trials])

    def __repr__(self) -> str:
        best = "no complete trial" if self.best is None else (
            f"best {self.objective}={self.best.value:.4g} (trial {self.best.number}, {self.best.params})")
        return f"<gpusession.SweepResult: {len(self.trials)} trials, {best}>"

    def _repr_html_(self) -> str:
        columns, rows = table_rows(self.trials, objective=self.objective, mode_min=self.mode_min)
        return table_html(columns, rows, repr(self))

    def table(self) -> str:
        columns, rows = table_rows(self.trials, objective=self.objective, mode_min=self.mode_min)
        return table_text(columns, rows)


class SweepFailed(GPUSessionError):
    """Too many trials failed (max_failed); the sweep stopped. `.result` holds what it got."""

    def __init__(self, message: str, result: SweepResult | None = None) -> None:
        super().__init__(message)
        self.result = result
