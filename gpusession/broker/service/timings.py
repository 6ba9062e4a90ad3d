"""How fast the broker answers, measured inside it: request handling, scheduling decisions, and
how late the event loop runs a timer (loop lag: what every caller waits on top of its own work)."""
from __future__ import annotations

import asyncio
import collections
import time

KEPT = 20_000  # samples per kind (a few minutes of a busy broker)
LAG_PROBE_S = 0.05


class Timings:
    def __init__(self) -> None:
        self.samples: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=KEPT))

    def add(self, kind: str, seconds: float) -> None:
        self.samples[kind].append(seconds)

    async def watch_loop(self) -> None:
        """Sleep LAG_PROBE_S again and again; record how much later than asked the loop woke us."""
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.add("loop_lag", max(0.0, time.perf_counter() - asked - LAG_PROBE_S))

    def summary(self) -> dict:
        """{kind: {"n", "p50_ms", "p99_ms", "max_ms"}} over the samples kept."""
        return {kind: _percentiles(list(values)) for kind, values in self.samples.items() if values}

    def reset(self) -> None:
        self.samples.clear()


def _percentiles(values: list[float]) -> dict:
    values.sort()

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)

    return {"n": len(values), "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(values[-1] * 1000, 3)}
