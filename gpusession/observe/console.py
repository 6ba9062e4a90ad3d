"""Plain-text rendering for scripts and terminals: `[rank k]` lines, a queue line, a receipt."""
from __future__ import annotations

import itertools
import sys
import threading

from .events import Observer, RunInfo
from .receipt import receipt_text
from .statusline import Phase, Status, status_text


class LineAssembler:
    """Turns output chunks into whole lines, prefixed `[rank k] ` when there are several ranks.

    Chunks split lines anywhere; holding the partial line per (rank, stream) keeps two ranks'
    lines from interleaving mid-line. A carriage return ends a line too (progress bars)."""

    def __init__(self, world_size: int) -> None:
        self.prefixed = world_size > 1
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, rank: int, stream: str, text: str) -> str:
        key = (rank, stream)
        buffered = self._partial.get(key, "") + text
        cut = max(buffered.rfind("\n"), buffered.rfind("\r"))
        if cut < 0:
            self._partial[key] = buffered
            return ""
        self._partial[key] = buffered[cut + 1:]
        return self._prefix(rank, buffered[: cut + 1])

    def flush(self) -> list[tuple[int, str, str]]:
        """The partial lines still held, as (rank, stream, text) with a final newline."""
        held = [(rank, stream, self._prefix(rank, text + "\n"))
                for (rank, stream), text in self._partial.items() if text]
        self._partial.clear()
        return held

    def _prefix(self, rank: int, text: str) -> str:
        if not self.prefixed:
            return text
        prefix = f"[rank {rank}] "
        out, start = [], 0
        for i, char in enumerate(text):
            if char in "\n\r":
                out.append(prefix + text[start:i + 1])
                start = i + 1
        return "".join(out)


class _InFlight:
    """The console calls of this process between their request and their receipt. While there
    are several (calls from plain threads, background runs), each one's lines carry `[call N]`,
    N counting this process's calls; a call that ran beside another keeps its label to the end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._going: set[int] = set()
        self._numbers = itertools.count(1)

    def number(self) -> int:
        return next(self._numbers)

    def start(self, number: int) -> None:
        with self._lock:
            self._going.add(number)

    def crowded(self) -> bool:
        with self._lock:
            return len(self._going) > 1

    def end(self, number: int) -> None:
        with self._lock:
            self._going.discard(number)


_in_flight = _InFlight()


class ConsoleObserver(Observer):
    """Plain text for a terminal or a log: one status line per change of phase (never redrawn, so
    a log file stays readable), worker lines as they come, a metrics line per report, the receipt.
    Each write is whole lines; lines of calls running at once in this process are labelled."""

    def __init__(self, world_size: int, *, stdout=None, stderr=None) -> None:
        self.lines = LineAssembler(world_size)
        self.stdout = stdout
        self.stderr = stderr
        self.status = Status(Phase.ASKING, 0.0)
        self._last_line = None
        self.number = _in_flight.number()
        self._labelled = False

    def _label(self, text: str) -> str:
        """`text` (whole lines) with this call's label on each line, once calls overlap."""
        self._labelled = self._labelled or _in_flight.crowded()
        if not self._labelled:
            return text
        tag = f"[call {self.number}] "
        return "".join(tag + line for line in text.splitlines(keepends=True))

    def _stream(self, name: str):
        chosen = self.stdout if name == "stdout" else self.stderr
        return chosen or (sys.stdout if name == "stdout" else sys.stderr)

    def _say(self, status: Status) -> None:
        self.status = status
        line = status_text(status, None)
        if line != self._last_line:  # one line per change, not per poll
            self._write("stderr", self._label(f"gpusession: {line}\n"))
            self._last_line = line

    def _write(self, stream: str, text: str) -> None:
        target = self._stream(stream)
        target.write(text)  # one write of whole lines: another thread's lines come before or after
        target.flush()

    def requesting(self, gpus: float, workers: int) -> None:
        _in_flight.start(self.number)
        self.status = Status(Phase.ASKING, 0.0, gpus=gpus, workers=workers)  # said only if it lasts

    def queued(self, view: dict, elapsed_s: float) -> None:
        self._say(self.status.moved(Phase.QUEUED, 0.0, view=dict(view), gpus=view.get("gpus") or self.status.gpus))

    def granted(self, info: RunInfo) -> None:
        self._say(self.status.moved(Phase.STARTING, 0.0, gpus=info.gpus, workers=info.workers,
                                    nodes=len(info.nodes), borrowed=info.over_quota))

    def running(self, info: RunInfo) -> None:
        _in_flight.start(self.number)  # a held lease's next run (no new request)
        self._say(self.status.moved(Phase.RUNNING, 0.0, gpus=info.gpus, borrowed=info.over_quota))

    def transition(self, info: RunInfo, line: str) -> None:
        self._say(self.status.moved(Phase.CHANGING, 0.0, line=line))

    def output(self, rank: int, stream: str, text: str) -> None:
        whole = self.lines.feed(rank, stream, text)
        if whole:
            self._write(stream, self._label(whole))

    def report(self, metrics: dict, info: RunInfo) -> None:
        parts = " ".join(f"{k}={_short(v)}" for k, v in metrics.items())
        self._write("stdout", self._label(f"[metrics] {parts}\n"))

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        for _rank, stream, text in self.lines.flush():
            self._write(stream, self._label(text))
        self._say(self.status.moved(Phase.DONE, 0.0, line=receipt_text(info, error)))
        self._last_line = None  # a held lease's next run says its receipt again
        _in_flight.end(self.number)

    def released(self, info: RunInfo) -> None:
        # A held lease released without a run (or after its last one), or a request that failed
        # before its run: no `finished` follows, and a call left counted as going would label
        # every later call of this process as overlapping.
        _in_flight.end(self.number)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
