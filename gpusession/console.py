"""Plain-text rendering for scripts and terminals: `[rank k]` lines, a queue line, a receipt."""
from __future__ import annotations

import sys

from .events import Observer, RunInfo


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


class ConsoleObserver(Observer):
    def __init__(self, world_size: int, *, stdout=None, stderr=None) -> None:
        self.lines = LineAssembler(world_size)
        self.stdout = stdout
        self.stderr = stderr
        self._last_queue_line = None

    def _stream(self, name: str):
        chosen = self.stdout if name == "stdout" else self.stderr
        return chosen or (sys.stdout if name == "stdout" else sys.stderr)

    def queued(self, view: dict, elapsed_s: float) -> None:
        line = (f"gpusession: waiting for {view['gpus']:g} GPUs · position {view.get('position') or '?'} · "
                f"{view.get('reason') or 'queued'}")
        if line != self._last_queue_line:  # one line per change, not per poll
            print(f"{line} · {elapsed_s:.0f} s", file=self._stream("stderr"), flush=True)
            self._last_queue_line = line

    def output(self, rank: int, stream: str, text: str) -> None:
        whole = self.lines.feed(rank, stream, text)
        if whole:
            target = self._stream(stream)
            target.write(whole)
            target.flush()

    def report(self, metrics: dict, info: RunInfo) -> None:
        parts = " ".join(f"{k}={_short(v)}" for k, v in metrics.items())
        print(f"[metrics] {parts}", file=self._stream("stdout"), flush=True)

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        for _rank, stream, text in self.lines.flush():
            self._stream(stream).write(text)
        outcome = "" if error is None else f" · {info.end_reason}"
        print(f"gpusession: {info.receipt()}{outcome}", file=self._stream("stderr"), flush=True)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
