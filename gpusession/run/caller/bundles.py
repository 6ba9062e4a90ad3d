"""A lease's placement group, bundle by bundle: where each bundle landed (its node and the GPU
ids Ray reserved for it), and removing the group until Ray's own view shows its GPUs free."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ...cluster import raycluster
from ...cluster.placement import PlacementState
from ...errors import Infeasible
from .pool import pool

log = logging.getLogger("gpusession")
FREE_TIMEOUT_S = 5.0  # bound on waiting for Ray's resource view after removing the group
PROBE_TIMEOUT_S = 180.0  # a probe may need a new Ray worker process: slow on a loaded node
# One group removal at a time in this process. Ray drops a removed group's keys from its view
# before it adds the GPUs back; a release that took its "before" reading inside another lease's
# removal would count that lease's GPUs coming back as its own and return while its own are still
# held (seen: two sweep trials stopped at once, 3 of 4 GPUs free when gs.sweep raised). A release
# in another process can still overlap; its GPUs then show free moments later.
_removing = threading.Lock()


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)  # a probe whose group vanished must fail, not wait
def _probe() -> tuple[str, str, list[str]]:
    """Runs inside one bundle: which node, and which GPU ids Ray reserved for that bundle."""
    context = ray.get_runtime_context()
    return context.get_node_id(), ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]


@ray.remote(num_cpus=0, max_calls=0)
def _nothing() -> None:
    """Asked for while the broker decides, so a process for the probes is up by the grant."""


def warm_probe_process() -> None:
    _nothing.remote()  # the first probe of a process would otherwise wait for a worker start


@dataclass(frozen=True)
class Slot:
    """One worker's place: its node and the GPU ids of its bundle."""

    index: int
    node_id: str
    address: str
    gpu_ids: tuple[str, ...]


def probe_slots(group, bundles: int, gpus_per_bundle: float, *, lease_id: int | None) -> list[Slot]:
    """Where each of the group's `bundles` landed: asked of the node hosts (warm), else probed."""
    found = pool().probe_bundles(group, bundles, gpus_per_bundle)
    if found is not None:
        return [Slot(i, node, address, tuple(gpus)) for i, (node, address, gpus) in enumerate(found)]
    probes = [
        _probe.options(num_gpus=gpus_per_bundle, scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=i)).remote()
        for i in range(bundles)
    ]
    try:
        found = ray.get(probes, timeout=PROBE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise Infeasible(
            f"Ray could not place the {bundles * gpus_per_bundle:g} GPUs of lease {lease_id} within "
            f"{PROBE_TIMEOUT_S:.0f} s (a node was lost and no other has room). Try again later."
        ) from None
    return [Slot(i, node, address, tuple(gpus)) for i, (node, address, gpus) in enumerate(found)]


def remove_group_and_wait(group, ours: dict[str, float], *, lease_id: int | None) -> None:
    """Remove the group, then wait (bounded) until Ray's own view shows its GPUs (`ours`: per
    node) free, before the broker hears of it: so no other lease can be placed on them first."""
    marker = group.id.hex()
    with _removing:
        state = ray.util.placement_group_table(group).get("state")  # none: Ray does not know it (yet)
        still_there = state is None or PlacementState.parse(state) is not PlacementState.REMOVED
        before = raycluster.unreserved_gpus_by_node(excluding_group=marker)
        remove_placement_group(group)
        if not still_there:  # the broker already took it back (revoke, preemption)
            return
        deadline = time.monotonic() + FREE_TIMEOUT_S
        while time.monotonic() < deadline:
            now = raycluster.unreserved_gpus_by_node(excluding_group=marker)
            if all(now.get(n, 0.0) >= before.get(n, 0.0) + gpus - 1e-6 for n, gpus in ours.items()):
                return
            time.sleep(0.005)
    log.warning("Ray still shows the GPUs of lease %s in use %.0f s after release.", lease_id, FREE_TIMEOUT_S)
