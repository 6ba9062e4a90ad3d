"""A held elastic lease (gs.lease with min_gpus) between runs: a thread makes a shrink the broker
asks for, or takes an offer to grow, as soon as it comes while no run is going. Left to the next
run, a shrink would miss the broker's deadline (the grace period) and the broker would take the
whole lease back. A run holds the lease's run lock: its follower handles notices itself."""
from __future__ import annotations

import logging
import threading
import time

import ray

from .resize import resize_between_runs

log = logging.getLogger("gpusession")
IDLE_WATCH_S = 1.0  # the watcher looks again this often (and at once on a notice)


def resize_while_idle(lease) -> None:
    """Start the watcher of this held lease if it is elastic (min_gpus < gpus); it ends when the
    lease is released or taken back."""
    bounds = lease.options.lease
    if bounds.min_workers is None or bounds.min_workers >= bounds.workers:
        return
    lease.watched_while_idle = True
    threading.Thread(target=_watch, args=(lease,), name=f"gpusession-lease-{lease.lease_id}-idle",
                     daemon=True).start()


def _watch(lease) -> None:
    while not lease.released and lease.watch_ref is not None:
        ready, _ = ray.wait([lease.watch_ref], timeout=IDLE_WATCH_S)
        if not ready or not lease.run_lock.acquire(timeout=IDLE_WATCH_S):
            continue  # nothing yet, or a run is going: its follower takes the notice
        failed = False
        try:
            if lease.released:
                return
            notice = lease.notice()
            if notice is None or not notice.kind.is_resize:
                return  # taken back (revoked, ended): the next run or release tells the user
            resize_between_runs(lease, notice)
        except Exception as exc:  # noqa: BLE001 - a passing failure (the broker restarting, Ray busy)
            # Keep watching: a shrink missed now would cost the whole lease at the broker's deadline.
            log.warning("Lease %s: could not resize between runs (%s); trying again in %.0f s.",
                        lease.lease_id, exc, IDLE_WATCH_S)
            failed = True
        finally:
            lease.run_lock.release()
        if failed:
            time.sleep(IDLE_WATCH_S)  # not holding the run lock: a run may start meanwhile
