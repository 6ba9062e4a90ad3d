"""Whatever leases this process still holds when it exits are released then (the set itself is
holding.py, which imports no Ray: a hub kernel's leases live in the gateway)."""
from __future__ import annotations

import atexit

import ray  # first: its own exit handler (ray.shutdown) must run after ours, which needs Ray

from .holding import add, discard, held_leases, release_all  # noqa: F401 - what lease.py uses


@atexit.register
def _release_at_exit() -> None:
    if ray.is_initialized():
        release_all("caller exited")
