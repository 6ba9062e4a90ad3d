"""Activity: which processes follow a live run, per account: the kernel (or script) a run's events stream
to, for as long as the run goes on. A user's Jupyter server asks for its own account's (the broker
session's `following` call) and counts a live run of one of its kernels as activity, so the hub's
idle culler leaves that server alone (issue 32, jupyter_ext/runactivity.py).

A run followed:
    a run of the kernel that called it (foreground or background)   from its request to its end
    a detached run, by the kernel that started it or attached        while that kernel follows it
                                                                      and the run has not ended
    a run on a held lease (gs.lease), by the kernel that holds it    from its request to its end
A detached run nobody follows is no one's activity: it goes on without a server.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .peer import Peer


class Following:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._live: dict[int, tuple[Peer, Callable[[], bool]]] = {}

    @contextmanager
    def live(self, peer: Peer, *, going: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """`peer` follows a run inside this block, for as long as `going()` is true."""
        key = next(self._ids)
        with self._lock:
            self._live[key] = (peer, going)
        try:
            yield
        finally:
            with self._lock:
                del self._live[key]

    def pids(self, uid: int) -> list[int]:
        """The processes of account `uid` following a live run now, each once, in order."""
        with self._lock:
            entries = list(self._live.values())
        return sorted({peer.pid for peer, going in entries if peer.uid == uid and going()})


FOLLOWING = Following()
