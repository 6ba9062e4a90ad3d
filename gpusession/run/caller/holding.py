"""The leases this process holds, of either kind: leases it holds itself (run/caller/lease.py) or
leases the gpusession gateway holds for this kernel (gateway/remotelease.py). `%gpu status`
lists them, `%gpu release` releases them. Imports no Ray.

A lease joins once the broker gave it an id and leaves when it is released. Threads of one
kernel (background runs, a user's own) acquire and release at the same time, so the set is
read and changed under a lock: a weak set changed while another thread iterates it raises."""
from __future__ import annotations

import threading
import weakref

from ..endings import end_reason

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


class HeldLease:
    """What a held lease of either kind shares: a `with` block that releases it (with the reason
    the block ended for) and its repr. Subclasses have lease_id, gpus, workers, released, release()."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release(end_reason(exc))

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<gpusession.Lease {self.lease_id}: {self.gpus:g} GPUs, {self.workers} workers, {state}>"
