"""What a notebook cell shows while a run waits, runs and ends (SPEC section 3).

One layout for a %%gpu cell and a @gs.distributed call, in JupyterLab, classic Notebook and
VS Code alike (plain display_data messages with display_id, no widgets):

    status line   never blank: asking -> queued -> starting workers -> running -> the receipt;
                  each restart and resize stays listed under it, with the time it happened
    metrics       `gs.report` as a table, then a plot, updated in place and throttled
    worker log    the kernel's own stdout/stderr, in whole lines, `[rank k]` prefixed

The status line and the two metrics displays are created before any worker can print, so the
log always comes below them, in order. A ticker thread keeps the status line's seconds moving
while no event comes (workers start for seconds in silence on a first call); it runs in a copy
of the cell's context, so its updates land in that cell and no other. The pure parts (what the
table and plot contain) come first and are unit-tested; the status line's words are in
statusline.py and the receipt's in receipt.py.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
import sys
import time
from numbers import Real
from typing import Any, Callable

from .console import LineAssembler
from .events import Observer, RunInfo
from .receipt import format_value, receipt_text, stopped_by_user
from .livestatus import LiveStatus
from .statusline import Phase, Status, queue_text, step_of

TABLE_ROWS = 8  # the last reports shown in the table; the plot shows them all
TABLE_EVERY_S = 0.25
PLOT_EVERY_S = 1.0  # drawing a PNG costs ~50 ms here: at most one a second while reports pour in



# ----- pure: what is shown ------------------------------------------------------------------------
def queue_line(view: dict, elapsed_s: float) -> str:
    return queue_text(view, elapsed_s)


def receipt_line(info: RunInfo, error: BaseException | None) -> str:
    return receipt_text(info, error)


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


_early: LiveStatus | None = None  # a %%gpu cell's line, shown before its inputs are packed


def show_early(gpus: float, workers: int) -> None:
    """Draw the status line now, before a %%gpu cell prepares its inputs (pickling the notebook's
    values can take a while); the cell's renderer then takes this line over."""
    global _early
    _early = LiveStatus(Status(Phase.ASKING, time.monotonic(), gpus=gpus, workers=workers))
    _early.show()


def _adopt_early() -> LiveStatus | None:
    global _early
    live, _early = _early, None
    return live if live is not None and live.attached else None


class NotebookObserver(Observer):
    """The renderer of runs made from an IPython kernel (%%gpu cells and @gs.distributed calls)."""

    def __init__(self, world_size: int, *, clock: Callable[[], float] = time.monotonic,
                 background: bool = False) -> None:
        self.lines = LineAssembler(world_size)
        self.clock = clock
        self.background = background  # the run outlives its cell: its line keeps updating there
        self.live: LiveStatus | None = _adopt_early() if clock is time.monotonic else None
        if background:  # drawn now, in the cell that submits it, before that cell can end
            if self.live is None:
                self.live = LiveStatus(Status(Phase.ASKING, clock(), workers=world_size), clock=clock,
                                       outlives_cell=True)
                self.live.show()
            self.live.outlive_cell()
        self._table = None  # display handles of this run's metrics, below the status line
        self._plot = None
        self._table_throttle = Throttle(TABLE_EVERY_S)
        self._plot_throttle = Throttle(PLOT_EVERY_S)
        self._history: list[dict] = []
        self._stale = False  # reports not drawn yet (throttled)
        self._drawn = False  # whether the table and plot displays hold any report yet

    # ----- the status line ------------------------------------------------------------------------
    def requesting(self, gpus: float, workers: int) -> None:
        since = self.live.status.since if self.live is not None and self.live.attached else self.clock()
        self._move(Status(Phase.ASKING, since, gpus=gpus, workers=workers))

    def queued(self, view: dict, elapsed_s: float) -> None:
        status = self._status()
        since = self.clock() - elapsed_s  # waiting counts from the request, as the receipt's queued_s
        self._move(status.moved(Phase.QUEUED, since, view=dict(view), gpus=view.get("gpus") or status.gpus),
                   draw=status.phase is not Phase.QUEUED)

    def granted(self, info: RunInfo) -> None:
        self._move(self._status().moved(Phase.STARTING, self.clock(), gpus=info.gpus, workers=info.workers,
                                        nodes=len(info.nodes), borrowed=info.over_quota))
        self._open_metrics()  # before any worker can print: the log comes below table and plot

    def running(self, info: RunInfo) -> None:
        self._move(self._status().moved(Phase.RUNNING, self.clock(), gpus=info.gpus, workers=info.workers,
                                        borrowed=info.over_quota, step=step_of(info.history)))

    def transition(self, info: RunInfo, line: str) -> None:
        self._move(self._status().moved(Phase.CHANGING, self.clock(), line=line, borrowed=info.over_quota),
                   draw=False)
        self.live.add_change(line, time.time())  # stays under the line when the run goes on
        self.live.redraw()

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        for _rank, stream, text in self.lines.flush():
            _write(stream, text)
        if self._stale:  # the final state is always on screen
            self._draw_metrics(final=True)
        stopped = stopped_by_user(error)
        self._move(self._status().moved(Phase.DONE, self.clock(), line=receipt_text(info, error),
                                        failed=error is not None and not stopped, stopped=stopped))
        self.live.stop()

    def _status(self) -> Status:
        return self.live.status if self.live is not None else Status(Phase.ASKING, self.clock())

    def _move(self, status: Status, *, draw: bool = True) -> None:
        if self.live is None or not self.live.attached:
            # first event, or a held lease's next run (a new cell): a line of its own, in this cell
            self.live = LiveStatus(status, clock=self.clock, outlives_cell=self.background)
            self._table = self._plot = None
            self._stale = False
            self.live.show()
        else:
            self.live.set(status, draw=draw)

    # ----- output and metrics ---------------------------------------------------------------------
    def output(self, rank: int, stream: str, text: str) -> None:
        whole = self.lines.feed(rank, stream, text)
        if whole:
            if self.live is None or not self.live.attached:  # a held lease's run in a new cell
                self._move(self._status().moved(Phase.RUNNING, self.clock()))
                self._open_metrics()
            _write(stream, whole)
        if self._stale:
            self._draw_metrics(final=False)

    def report(self, metrics: dict, info: RunInfo) -> None:
        if info.history is not self._history:  # each run starts a new history list
            self._history = info.history
            if self.live is None or not self.live.attached:  # a held lease's run in a new cell
                self._move(self._status().moved(Phase.RUNNING, self.clock()))
            if self._drawn:  # the displays hold an earlier run of a held lease: new ones for this run
                self._table = self._plot = None
            self._open_metrics()
        if self.live is not None and self.live.status.phase is Phase.RUNNING:
            self.live.set(replace_step(self.live.status, step_of(self._history)), draw=False)  # the ticker draws it
        self._stale = True
        self._draw_metrics(final=False)

    def _open_metrics(self) -> None:
        """Empty displays for the table and the plot, so they sit between the status and the log."""
        if self._table is None:
            self._table = _display({"text/plain": ""})
            self._plot = _display({"text/plain": ""})
            self._drawn = False

    def _draw_metrics(self, *, final: bool) -> None:
        history = list(self._history)
        if not history:
            return
        self._open_metrics()
        table_due = self._table_throttle.due() or final
        plot_due = self._plot_throttle.due() or final
        self._drawn = True
        if table_due:
            self._table.update(table_bundle(history), raw=True)
        if plot_due:
            png = plot_png(history)
            if png is not None:
                image = base64.b64encode(png).decode("ascii")
                self._plot.update({"image/png": image, "text/plain": "<metrics plot>"}, raw=True)
        # what was throttled now is drawn at the next event, or at the end
        self._stale = not (table_due and plot_due)


def replace_step(status: Status, step) -> Status:
    return dataclasses.replace(status, step=step)


def _display(bundle: dict):
    from IPython.display import display

    return display(bundle, raw=True, display_id=True)


def _show(handle, bundle: dict):
    """Create the display the first time, update it in place afterwards (the sweep's views)."""
    if handle is None:
        return _display(bundle)
    handle.update(bundle, raw=True)
    return handle


def _write(stream: str, text: str) -> None:
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(text)
    target.flush()  # the kernel sends a stream message now rather than at its next flush tick

