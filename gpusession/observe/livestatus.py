"""The status line of a notebook cell: one display updated in place, and a ticker thread that
keeps its seconds moving while no event comes.

Output from a thread of an IPython kernel goes to the cell whose context the thread runs in
(ipykernel keeps the parent message in a contextvar): the ticker runs in a copy of the context of
the cell that created the line, so a tick never lands in a later cell. It stops when the run is
done, or when that cell's execution ends (a held `gs.lease` waits between cells: its line then
stays as it was, and the next run in another cell gets a line of its own).

Under the line, the run's restarts and resizes stay listed with the time each happened: the line
itself moves on to "running" within seconds, and a user who looked away must still see that the
run changed course.
"""
from __future__ import annotations

import contextvars
import html
import threading
import time
from typing import Callable

from .statusline import Status, status_html, status_text

TICK_S = 0.25  # redraws only when the text changed, so about once a second


# ----- pure: the changes of course listed under the line -------------------------------------------
def timed(line: str, at: float) -> str:
    """"12:03:04 rank 3 died on ...": the wall-clock time the kernel heard of it, then the line."""
    return f"{time.strftime('%H:%M:%S', time.localtime(at))} {line}"


def with_changes_text(line: str, changes: list[str]) -> str:
    return "\n".join([line, *(f"  {change}" for change in changes)])


def changes_html(changes: list[str]) -> str:
    if not changes:
        return ""
    rows = "".join(f"<div>{html.escape(change)}</div>" for change in changes)
    return ("<div class='gpusession-changes' style='font-family:var(--jp-ui-font-family,sans-serif);"
            f"font-size:0.9em;margin-left:6.3em;color:#b26a00'>{rows}</div>")


class LiveStatus:
    def __init__(self, status: Status, *, clock: Callable[[], float] = time.monotonic,
                 outlives_cell: bool = False) -> None:
        self.clock = clock
        self.outlives_cell = outlives_cell  # a background run's line: it goes on after its cell ends
        self.status = status
        self._lock = threading.Lock()
        self._handle = None
        self._shown = None  # the text last drawn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shell = None
        self.changes: list[str] = []  # the run's restarts and resizes, timed, kept under the line

    @property
    def attached(self) -> bool:
        """Still drawing in the cell that created it."""
        return self._handle is not None and not self._stop.is_set()

    def show(self) -> None:
        """Draw the line now, in the current cell, and start ticking."""
        from IPython.display import display

        with self._lock:
            self._shown = self._text()
            self._handle = display(self._bundle(self._shown), raw=True, display_id=True)
        context = contextvars.copy_context()  # the cell's parent message, for the ticker's updates
        self._stop.clear()
        self._thread = threading.Thread(target=context.run, args=(self._tick,), name="gpusession-status",
                                        daemon=True)
        self._thread.start()
        self._watch_cell_end()

    def add_change(self, line: str, at: float) -> None:
        """Keep a restart or resize line under the status line for the rest of the run."""
        with self._lock:
            self.changes.append(timed(line, at))

    def set(self, status: Status, *, draw: bool = True) -> None:
        with self._lock:
            self.status = status
        if draw:
            self.redraw()

    def redraw(self) -> None:
        with self._lock:  # one drawer at a time, always of the newest status
            if self._handle is None:
                return
            text = self._text()
            if text != self._shown:
                self._shown = text
                self._handle.update(self._bundle(text), raw=True)

    def stop(self) -> None:
        self._stop.set()
        self._unwatch_cell_end()

    def _text(self) -> str:
        return with_changes_text(status_text(self.status, self.clock()), self.changes)

    def _bundle(self, text: str) -> dict:
        return {"text/plain": text, "text/html": status_html(self.status, self.clock()) + changes_html(self.changes)}

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.redraw()
            except Exception:  # the frontend went away: a status line is not worth a traceback
                return

    def outlive_cell(self) -> None:
        """From now on the line keeps updating after its cell ended (a background run's)."""
        self.outlives_cell = True
        self._unwatch_cell_end()

    def _watch_cell_end(self) -> None:
        if self.outlives_cell:
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is not None and self._shell is None:
            self._shell = shell
            shell.events.register("post_run_cell", self._cell_ended)

    def _unwatch_cell_end(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            try:
                shell.events.unregister("post_run_cell", self._cell_ended)
            except ValueError:
                pass

    def _cell_ended(self, *_args) -> None:
        self.stop()
