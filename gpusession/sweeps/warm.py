"""Keep a trial from paying a worker process start inside its lease.

Each rank runs in a fresh process forked from a warm worker's parent, and a stopped trial only
loses its rank processes; but a worker that is not warm yet (the first trial on a node, or one
whose worker died) must start Python and import torch: seconds, or a minute on a loaded 2-core
machine. Started inside the next trial's lease, that is leased GPU-time no trial uses. So
before a sweep's slot asks for its next lease, it waits (holding no GPU) until warm workers are
ready on the nodes its last trial used; when they already are, this costs one round trip.
"""
from __future__ import annotations

import logging

log = logging.getLogger("gpusession")


def _pool():
    try:
        from ..run.caller.pool import pool
    except ImportError:
        return None
    warm = pool()
    return warm if hasattr(warm, "acquire") and hasattr(warm, "give_back") else None


def gpu_nodes(addresses: list[str] | None = None) -> list[str]:
    """Node ids of alive nodes with GPUs (at these addresses, when given)."""
    from ..cluster import raycluster

    return [n.node_id for n in raycluster.nodes() if n.gpus > 0 and (addresses is None or n.address in addresses)]


def wait_for_warm_workers(node_ids: list[str], workers: int, runtime_env: dict | None) -> None:
    """Until `workers` warm workers are ready over these nodes (started now if the pool lacks
    them); they stay in the pool for the next lease."""
    warm = _pool()
    if warm is None or not node_ids or workers < 1:
        return
    wanted = [node_ids[i % len(node_ids)] for i in range(workers)]
    try:
        warm.give_back(warm.acquire(wanted, runtime_env))
    except Exception as exc:  # the lease will start its own workers, as without a sweep
        log.warning("Could not warm workers for the next trial (%s); it starts its own.", exc)
