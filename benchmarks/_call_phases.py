"""Where a warm gpusession call spends its time: lease, placement, fork, rendezvous, function,
return, release (and what follows the release before the call returns).

Measured from outside the run path, which stays as it is: an Observer notes when the call asks
for GPUs, when the group is placed and when the lease is released; a wrapper notes when the
release begins; each rank reports when its process was forked (its start time in /proc), and when
its function began and ended. The boundaries are the slowest rank's, on one machine's clock.
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field

PHASES = ("lease", "placement", "fork", "rendezvous", "function", "return", "release", "after release")


@dataclass
class Marks:
    """Wall-clock times (time.time()) of one call, filled as it runs."""

    called: float = 0.0
    requesting: float = 0.0
    queued_s: float = 0.0  # RunInfo.queued_s: the call's request to the broker's grant
    placed: float = 0.0  # observer.granted: the placement group is ready and its workers assigned
    release_started: float = 0.0
    released: float = 0.0
    returned: float = 0.0
    ranks: list = field(default_factory=list)  # each rank's {"forked", "entered", "exited"}


def phases(marks: Marks) -> dict[str, float]:
    """Seconds per phase; they add up to the call's wall clock (called -> returned)."""
    granted = marks.requesting + marks.queued_s
    forked = max(rank["forked"] for rank in marks.ranks)
    entered = max(rank["entered"] for rank in marks.ranks)
    exited = max(rank["exited"] for rank in marks.ranks)
    bounds = [marks.called, granted, marks.placed, forked, entered, exited, marks.release_started,
              marks.released, marks.returned]
    return {name: round(end - start, 4) for name, start, end in zip(PHASES, bounds, bounds[1:])}


def process_start_time() -> float:
    """When this process was forked (wall clock, to a clock tick), from /proc/self/stat (clock
    ticks since boot). The boot time is the wall clock less CLOCK_BOOTTIME, not /proc/stat's
    btime: that is whole seconds, which put every fork up to 1 s early (a "fork" phase of -0.12 s)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def timed_body(body):
    """FN's rank-side wrapper: its result, and the rank's fork, entry and exit times."""
    @functools.wraps(body)
    def wrapper(*args, **kwargs):
        entered = time.time()
        result = body(*args, **kwargs)
        return result, {"forked": process_start_time(), "entered": entered, "exited": time.time()}
    return wrapper


class PhaseClock:
    """Installs the observer and the release wrapper; `call(fn)` returns fn's result and Marks."""

    def __init__(self) -> None:
        from gpusession.observe import events
        from gpusession.run.caller.lease import Lease

        self.marks = Marks()
        clock = self

        class Observer(events.Observer):
            def requesting(self, gpus, workers):
                clock.marks.requesting = time.time()

            def granted(self, info):
                clock.marks.placed = time.time()

            def released(self, info):
                clock.marks.released = time.time()
                clock.marks.queued_s = info.queued_s

        events.set_observer_factory(lambda world_size: Observer())
        release = Lease.release

        @functools.wraps(release)
        def noted_release(lease, *args, **kwargs):
            clock.marks.release_started = time.time()
            return release(lease, *args, **kwargs)

        Lease.release = noted_release

    def call(self, distributed_fn, *args):
        """One call of a return_all=True function wrapped by timed_body: rank 0's result, Marks."""
        self.marks = Marks(called=time.time())
        results = distributed_fn(*args)
        self.marks.returned = time.time()
        self.marks.ranks = [timing for _, timing in results]
        return results[0][0], self.marks
