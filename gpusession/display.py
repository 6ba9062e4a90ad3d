"""What a notebook cell shows while a run waits, runs and ends (SPEC section 3).

One live queue line while waiting (gone on grant); worker output as the kernel's own stdout and
stderr, in whole lines; `gs.report` metrics as one table and one plot that are updated in place
(display_id), throttled so a fast loop cannot flood the frontend; a one-line receipt at the end.
The pure parts (what the line, table, plot and receipt contain) come first and are unit-tested.
"""
from __future__ import annotations

import base64
import html
import io
import math
import sys
import time
from numbers import Real
from typing import Any, Callable

from .console import LineAssembler
from .events import Observer, RunInfo

TABLE_ROWS = 8  # the last reports shown in the table; the plot shows them all
TABLE_EVERY_S = 0.25
PLOT_EVERY_S = 1.0  # drawing a PNG costs ~50 ms here: at most one a second while reports pour in
QUEUE_EVERY_S = 0.5


# ----- pure: what is shown ------------------------------------------------------------------------
def queue_line(view: dict, elapsed_s: float) -> str:
    gpus = view.get("gpus") or 0
    position = view.get("position")
    where = f"position {position} in the queue" if position else "in the queue"
    why = view.get("reason") or "waiting"
    return f"⏳ waiting for {gpus:g} GPU{'s' if gpus != 1 else ''} · {where} · {why} · {elapsed_s:.0f} s"


def receipt_line(info: RunInfo, error: BaseException | None) -> str:
    if error is not None and not info.gpus:  # never granted: rejected, timed out or stopped in the queue
        return f"✗ {type(error).__name__} · nothing was leased"
    outcome = "✓" if error is None else f"✗ {info.end_reason or type(error).__name__} ·"
    where = " (logical GPUs: the workers ran on the CPU)" if info.logical_gpus else ""
    return f"{outcome} {info.receipt()}{where}"


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))


def metric_series(history: list[dict]) -> tuple[str, dict[str, tuple[list, list]]]:
    """(x label, {key: (xs, ys)}) for every numeric key, against `step` when the report has
    one, else the report's index."""
    series: dict[str, tuple[list, list]] = {}
    uses_step = any(_is_number(report.get("step")) for report in history)
    for index, report in enumerate(history):
        x = report.get("step") if _is_number(report.get("step")) else index
        for key, value in report.items():
            if key != "step" and _is_number(value):
                xs, ys = series.setdefault(key, ([], []))
                xs.append(x)
                ys.append(float(value))
    return ("step" if uses_step else "report"), series


def metric_table(history: list[dict], limit: int = TABLE_ROWS) -> tuple[list[str], list[list[str]], int]:
    """(columns, rows of formatted cells, how many earlier reports are not shown)."""
    columns: list[str] = []
    for report in history:
        columns.extend(key for key in report if key not in columns)
    shown = history[-limit:] if limit else history
    rows = [[format_value(report[key]) if key in report else "" for key in columns] for report in shown]
    return columns, rows, len(history) - len(shown)


def wants_log_scale(values: list[float]) -> bool:
    """A loss falling over orders of magnitude is a flat line at the bottom on a linear axis."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class Throttle:
    """due() is true at most once per interval; the clock is injectable for tests."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        return True


# ----- rendering ------------------------------------------------------------------------------------
def table_bundle(history: list[dict]) -> dict:
    columns, rows, hidden = metric_table(history)
    note = f"{len(history)} reports, last {len(rows)} shown" if hidden else f"{len(history)} reports"
    width = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    text_rows = [columns] + rows
    plain = "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, width)) for row in text_rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    markup = (f"<table class='gpusession-metrics'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
              f"<div style='font-size:smaller;opacity:0.7'>{note}</div>")
    return {"text/plain": f"{plain}\n({note})", "text/html": markup}


def plot_png(history: list[dict]) -> bytes | None:
    """One figure, one small panel per numeric key (scales differ: loss vs accuracy vs lr)."""
    x_label, series = metric_series(history)
    if not series:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(3, len(series))
    rows = math.ceil(len(series) / columns)
    figure = Figure(figsize=(3.6 * columns, 2.5 * rows), dpi=80, layout="constrained")
    FigureCanvasAgg(figure)
    for i, (key, (xs, ys)) in enumerate(series.items()):
        axes = figure.add_subplot(rows, columns, i + 1)
        axes.plot(xs, ys, marker="." if len(xs) < 30 else None)
        axes.set_title(key)
        if wants_log_scale(ys):
            axes.set_yscale("log")
        axes.set_xlabel(x_label)
        axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


class NotebookObserver(Observer):
    """The renderer of runs made from an IPython kernel (%%gpu cells and @gs.distributed calls)."""

    def __init__(self, world_size: int) -> None:
        self.lines = LineAssembler(world_size)
        self._queue = None  # display handles, created when first needed
        self._table = None
        self._plot = None
        self._queue_throttle = Throttle(QUEUE_EVERY_S)
        self._table_throttle = Throttle(TABLE_EVERY_S)
        self._plot_throttle = Throttle(PLOT_EVERY_S)
        self._history: list[dict] = []
        self._stale = False  # reports not drawn yet (throttled)

    def queued(self, view: dict, elapsed_s: float) -> None:
        line = queue_line(view, elapsed_s)
        bundle = {"text/plain": line, "text/html": f"<div style='opacity:0.8'>{html.escape(line)}</div>"}
        if self._queue is None:
            self._queue = _display(bundle)
        elif self._queue_throttle.due():
            self._queue.update(bundle, raw=True)

    def granted(self, info: RunInfo) -> None:
        self._clear_queue_line()

    def output(self, rank: int, stream: str, text: str) -> None:
        whole = self.lines.feed(rank, stream, text)
        if whole:
            _write(stream, whole)
        if self._stale:
            self._draw_metrics(final=False)

    def report(self, metrics: dict, info: RunInfo) -> None:
        if info.history is not self._history:  # a new run (several lease.run calls share us)
            self._table = self._plot = None  # its own table and plot, in the cell it runs in
            self._history = info.history
        self._stale = True
        self._draw_metrics(final=False)

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        self._clear_queue_line()
        for _rank, stream, text in self.lines.flush():
            _write(stream, text)
        if self._stale:  # the final state is always on screen
            self._draw_metrics(final=True)
        line = receipt_line(info, error)
        _display({"text/plain": line,
                  "text/html": f"<div style='font-size:smaller;opacity:0.8'>{html.escape(line)}</div>"})

    def _clear_queue_line(self) -> None:
        if self._queue is not None:
            self._queue.update({"text/plain": "", "text/html": ""}, raw=True)
            self._queue = None

    def _draw_metrics(self, *, final: bool) -> None:
        history = list(self._history)
        table_due = self._table_throttle.due() or final or self._table is None
        plot_due = self._plot_throttle.due() or final or self._plot is None
        if table_due:
            self._table = _show(self._table, table_bundle(history))
        if plot_due:
            png = plot_png(history)
            if png is not None:
                image = base64.b64encode(png).decode("ascii")
                self._plot = _show(self._plot, {"image/png": image, "text/plain": "<metrics plot>"})
        # what was throttled now is drawn at the next event, or at the end
        self._stale = not (table_due and plot_due)


def _display(bundle: dict):
    from IPython.display import display

    return display(bundle, raw=True, display_id=True)


def _show(handle, bundle: dict):
    """Create the display the first time, update it in place afterwards."""
    if handle is None:
        return _display(bundle)
    handle.update(bundle, raw=True)
    return handle


def _write(stream: str, text: str) -> None:
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(text)
    target.flush()  # the kernel sends a stream message now rather than at its next flush tick
