"""What a run tells the world while it happens (Observer), and what it leaves behind (RunInfo).

Renderers subscribe by implementing Observer: the console one prints lines, the notebook one
(display.py) draws a live queue line, metrics table, plot and receipt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class RunInfo:
    """The record of one call: where it ran, what it cost, what it reported."""

    lease_id: int | None = None
    gpus: float = 0.0
    workers: int = 0
    backend: str | None = None
    logical_gpus: bool = False
    nodes: list[str] = field(default_factory=list)
    queued_s: float = 0.0  # request to grant
    setup_s: float = 0.0  # grant to every rank running the function
    run_s: float = 0.0  # the function's span
    gpu_seconds: float = 0.0  # GPUs x (grant to release)
    history: list[dict] = field(default_factory=list)  # rank 0's gs.report calls, in order
    restarts: int = 0
    resizes: int = 0
    over_quota: bool = False  # on borrowed GPUs: preempted first when their owner wants them
    steps_lost: int = 0  # reports made after the last checkpoint by attempts that then failed
    transitions: list[str] = field(default_factory=list)  # restart and resize lines, in order
    rank_hosts: dict[int, str] = field(default_factory=dict)  # rank -> "host (ip)" it ran on
    state: str | None = None  # the run's state (run.policies.RunState value)
    end_reason: str | None = None  # finished | failed | interrupted | cancelled | timeout | revoked | preempted
    released: bool = False
    communication: Any = None  # comm_options.CommReport: grad compression, precision, bytes per step
    shipped_bytes: int = 0  # the call's big arrays and tensors, sent out of band (run/bulk.py)
    shipped_s: float = 0.0  # pickling them and putting them in the object store, in the caller
    returned_bytes: int = 0  # the returned values' pickles and big buffers, as the caller got them
    returned_s: float = 0.0  # fetching them from the object store and unpickling them in the caller
    # rank 0's last committed checkpoint, held in Ray's object store (`checkpoint` fetches it;
    # `.resume()` and a restarted attempt continue from it)
    checkpoint_ref: Any = field(default=None, repr=False)
    checkpoint_step: Any = field(default=None, repr=False)  # rank 0's last reported step before it

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint rank 0 saved (fetched from the object store), or None."""
        if self.checkpoint_ref is None:
            return None
        import cloudpickle

        fetch = getattr(self.checkpoint_ref, "fetch", None)
        if fetch is not None:  # a checkpoint the gpusession gateway holds (gateway/remote.py)
            return cloudpickle.loads(fetch())
        import ray

        return cloudpickle.loads(ray.get(self.checkpoint_ref).data)

    def receipt(self) -> str:
        """One line: GPUs, queued/setup/run seconds, GPU-seconds, restarts, resizes, steps lost,
        borrowed, the hosts when there are several, released."""
        from .receipt import costs

        return costs(self)

    # A short receipt and a summarised history wherever the object is shown (a notebook's Out[],
    # a terminal, a log line); the dataclass repr would print every report in full precision.
    def __repr__(self) -> str:
        from .receipt import run_title

        count = len(self.history)
        return f"<{run_title(self)}: {self.receipt()}; {count} report{'s' if count != 1 else ''}>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        from .receipt import as_text

        printer.text("RunInfo(...)" if cycle else as_text(self))

    def _repr_html_(self) -> str:
        from .receipt import as_html

        return as_html(self)


class Observer:
    """Receives a run's events as they happen; every method may be left as is."""

    def requesting(self, gpus: float, workers: int) -> None:
        """The call has begun: nothing is known yet (connecting to Ray can take seconds on a
        first call), but the status line can show from the first second."""

    def queued(self, view: dict, elapsed_s: float) -> None:
        """Waiting for GPUs: view has gpus, position, reason (see broker/views.lease_view)."""

    def granted(self, info: RunInfo) -> None:
        """The GPUs are ours; the queue line can go."""

    def output(self, rank: int, stream: str, text: str) -> None:
        """A chunk of a worker's stdout or stderr (not necessarily whole lines)."""

    def report(self, metrics: dict, info: RunInfo) -> None:
        """Rank 0 called gs.report; info.history already holds it."""

    def running(self, info: RunInfo) -> None:
        """Every rank of the current attempt runs the function (info.setup_s is set)."""

    def transition(self, info: RunInfo, line: str) -> None:
        """The run changed course: a restart or a resize, told in one line, e.g.
        "rank 3 died on node 10.0.0.4 (SIGKILL): restarting from the checkpoint after step 120
        (attempt 2 of 4)"."""

    def poll(self) -> None:
        """Called by the run's loop a few times a second while the run is queued or running.
        It may raise to stop the run (a sweep pruning a trial, a stop flag set by another
        thread): the run then ends as if interrupted, every GPU released, and the exception
        propagates to the caller."""

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        """The run ended and its GPUs were released."""

    def released(self, info: RunInfo) -> None:
        """The lease is over: its GPUs were given back, or it was never granted (a held lease
        released after any number of runs, none included; a request that failed or gave up)."""


class Fanout(Observer):
    def __init__(self, *observers: Observer) -> None:
        self.observers = [o for o in observers if o is not None]

    def requesting(self, gpus, workers):
        for o in self.observers:
            o.requesting(gpus, workers)

    def queued(self, view, elapsed_s):
        for o in self.observers:
            o.queued(view, elapsed_s)

    def granted(self, info):
        for o in self.observers:
            o.granted(info)

    def output(self, rank, stream, text):
        for o in self.observers:
            o.output(rank, stream, text)

    def report(self, metrics, info):
        for o in self.observers:
            o.report(metrics, info)

    def running(self, info):
        for o in self.observers:
            o.running(info)

    def transition(self, info, line):
        for o in self.observers:
            o.transition(info, line)

    def poll(self):
        for o in self.observers:
            o.poll()

    def finished(self, info, error):
        for o in self.observers:
            o.finished(info, error)

    def released(self, info):
        for o in self.observers:
            o.released(info)


_factory: Callable[[int], Observer] | None = None


def set_observer_factory(factory: Callable[[int], Observer] | None) -> None:
    """Make `factory(world_size)` the renderer of every following call in this process."""
    global _factory
    _factory = factory


def _in_notebook_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
