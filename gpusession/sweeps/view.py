"""What a sweep shows while it runs: in a notebook, one live trials table and one plot updated
in place; in a terminal, one line per trial event. Trial threads only record what changed;
the caller's thread draws (tick), so the frontend gets every message from one thread.
"""
from __future__ import annotations

import base64
import sys
import threading
from collections import deque

from ..observe.console import LineAssembler
from ..observe.display import Throttle, _show
from ..observe.events import _in_notebook_kernel
from .records import TrialRecord, TrialState
from .table import STATE_MARKS, plot_png, summary_line, table_html, table_rows, table_text

TABLE_EVERY_S = 0.5
PLOT_EVERY_S = 2.0  # a PNG costs ~100 ms on a small machine


class SweepBoard:
    """The shared part: records by number, pending output, whether anything changed."""

    def __init__(self, *, objective: str, mode_min: bool, budget: int, world_size: int) -> None:
        self.objective, self.mode_min, self.budget, self.world_size = objective, mode_min, budget, world_size
        self.records: dict[int, TrialRecord] = {}
        self._lock = threading.Lock()
        self._dirty = False
        self._events: deque[str] = deque()  # one line per trial transition, worded when it happened
        self._lines: dict[int, LineAssembler] = {}
        self._output: deque[tuple[str, str]] = deque()
        self._shown_state: dict[int, TrialState] = {}
        self.closed = False

    # ----- any thread ------------------------------------------------------------------------------
    def changed(self, record: TrialRecord) -> None:
        with self._lock:
            self.records[record.number] = record
            self._dirty = True
            if self._shown_state.get(record.number) is not record.state:  # a transition: one line
                self._events.append(self.event_line(record))
                self._shown_state[record.number] = record.state

    def event_line(self, record: TrialRecord) -> str:
        params = " ".join(f"{k}={_short(v)}" for k, v in record.params.items())
        state = record.state
        line = f"gpusession sweep: trial {record.number} {STATE_MARKS[state]}"
        if state is TrialState.QUEUED:
            return f"{line} · {params}"
        if record.value is not None:
            line += f" · {self.objective} {record.value:.4g} at step {record.step}"
        if state.is_terminal:
            line += f" · {record.gpu_seconds:.1f} GPU·s"
        if record.error and state is TrialState.FAILED:
            line += f" · {record.error}"
        return line

    def output(self, record: TrialRecord, rank: int, stream: str, text: str) -> None:
        with self._lock:
            lines = self._lines.setdefault(record.number, LineAssembler(self.world_size))
            whole = lines.feed(rank, stream, text)
            if whole:
                self._output.append((stream, _prefix(record.number, whole)))

    # ----- the caller's thread ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Draw what changed (throttled)."""

    def close(self, error: BaseException | None) -> None:
        """Draw the final state."""

    def _take(self) -> tuple[list, list, bool]:
        with self._lock:
            events, output, dirty = list(self._events), list(self._output), self._dirty
            self._events.clear()
            self._output.clear()
            self._dirty = False
            return events, output, dirty

    def _flush_partial_lines(self) -> None:
        with self._lock:
            for number, lines in self._lines.items():
                for _rank, stream, text in lines.flush():
                    self._output.append((stream, _prefix(number, text)))

    def snapshot(self) -> list[TrialRecord]:
        with self._lock:
            return list(self.records.values())

    def summary(self) -> str:
        records = self.snapshot()
        line = summary_line(records, budget=self.budget, objective=self.objective, mode_min=self.mode_min)
        if self.closed and all(r.state.is_terminal for r in records):  # every trial's lease ended
            line += " · every GPU released"
        return line


def _prefix(number: int, text: str) -> str:
    return "".join(f"[trial {number}] {line}" for line in text.splitlines(keepends=True))


class ConsoleBoard(SweepBoard):
    """One line per trial event on stderr; worker output on the caller's stdout/stderr."""

    def __init__(self, *args, stream=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stream = stream

    def tick(self) -> None:
        events, output, _ = self._take()
        for stream, text in output:
            (sys.stdout if stream == "stdout" else sys.stderr).write(text)
        for line in events:
            print(line, file=self.stream or sys.stderr, flush=True)

    def close(self, error: BaseException | None) -> None:
        self.closed = True
        self._flush_partial_lines()
        self.tick()
        columns, rows = table_rows(self.snapshot(), objective=self.objective, mode_min=self.mode_min)
        print(table_text(columns, rows), file=self.stream or sys.stderr)
        print(f"gpusession sweep: {self.summary()}", file=self.stream or sys.stderr, flush=True)


class NotebookBoard(SweepBoard):
    """A live table (sorted by objective) and a plot, each updated in place (display_id)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._table = self._plot = None
        self._table_throttle, self._plot_throttle = Throttle(TABLE_EVERY_S), Throttle(PLOT_EVERY_S)
        self._plot_stale = False

    def tick(self, *, final: bool = False) -> None:
        _events, output, dirty = self._take()
        for stream, text in output:
            target = sys.stdout if stream == "stdout" else sys.stderr
            target.write(text)
            target.flush()
        self._plot_stale = self._plot_stale or dirty
        if (dirty or final or self._table is None) and (self._table_throttle.due() or final):
            records = self.snapshot()
            columns, rows = table_rows(records, objective=self.objective, mode_min=self.mode_min)
            summary = self.summary()
            self._table = _show(self._table, {"text/plain": f"{summary}\n{table_text(columns, rows)}",
                                              "text/html": table_html(columns, rows, summary)})
        if self._plot_stale and (self._plot_throttle.due() or final):
            png = plot_png(self.snapshot(), objective=self.objective, mode_min=self.mode_min)
            if png is not None:
                image = base64.b64encode(png).decode("ascii")
                self._plot = _show(self._plot, {"image/png": image, "text/plain": "<trials plot>"})
                self._plot_stale = False

    def close(self, error: BaseException | None) -> None:
        self.closed = True
        self._flush_partial_lines()
        self.tick(final=True)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def make_board(**kwargs) -> SweepBoard:
    return NotebookBoard(**kwargs) if _in_notebook_kernel() else ConsoleBoard(**kwargs)
