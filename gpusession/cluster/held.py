"""The leases this process holds: `%gpu` lists them, `%gpu_release` releases them, and whatever
is still held when the process exits is released then.

A lease joins once the broker gave it an id and leaves when it is released. Threads of one
kernel (background runs, a user's own) acquire and release at the same time, so the set is
read and changed under a lock: a weak set changed while another thread iterates it raises."""
from __future__ import annotations

import atexit
import threading
import weakref

import ray  # first: its own exit handler (ray.shutdown) must run after ours, which needs Ray

_live: "weakref.WeakSet" = weakref.WeakSet()
_lock = threading.Lock()


def add(lease) -> None:
    with _lock:
        _live.add(lease)


def discard(lease) -> None:
    with _lock:
        _live.discard(lease)


def held_leases() -> list:
    """Leases this process still holds."""
    with _lock:
        leases = list(_live)
    return [lease for lease in leases if not lease.released]


def release_all(reason: str = "released") -> int:
    """Release every lease this process holds; how many there were."""
    leases = held_leases()
    for held in leases:
        held.release(reason)
    return len(leases)


@atexit.register
def _release_at_exit() -> None:
    if ray.is_initialized():
        release_all("caller exited")
