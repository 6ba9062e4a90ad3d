"""PURE: where a lease's workers go when hosts under a run were lost and it restarts at its size.

The workers on the hosts that remain stay where they are; those of the lost hosts move to GPUs
free now on other hosts, placed by the same fit function as a grant (placement.plan). No room:
the answer says why, in numbers, and what to do. The broker applies the answer with no await
in between (service.py), so no other request can take those GPUs first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from .messages import gpus_text
from .model import EPSILON, Placement
from .placement import plan


@dataclass(frozen=True)
class Relocation:
    node_workers: dict[str, int] | None  # the lease's whole placement after the move; None: no room
    why: str = ""  # no room: the numbers and the next step, as a clause ("the hosts that remain ...")


def relocate(held: Mapping[str, int], lost: Collection[str], *, free_by_node: Mapping[str, float],
             total_by_node: Mapping[str, float], gpus_per_worker: float,
             placement: Placement | str) -> Relocation:
    """`held`: the lease's workers per node; `lost`: the hosts gone under it; `free_by_node`:
    GPUs free now with every active lease counted (this one too); `total_by_node`: each node's
    GPUs. The workers of the lost hosts move where they fit, the others stay."""
    placement = Placement.parse(placement)
    kept = {node: n for node, n in held.items() if node not in lost and n}
    moving = sum(n for node, n in held.items() if node in lost)
    needed = sum(held.values()) * gpus_per_worker
    remaining = sum(gpus for node, gpus in total_by_node.items() if node not in lost)
    if remaining + EPSILON < needed:  # no wait could help, short of the host coming back
        return Relocation(None, f"the hosts that remain have {gpus_text(remaining)} in all, fewer than the "
                                f"{needed:g} the run needs")
    free = {node: gpus for node, gpus in free_by_node.items() if node not in lost}
    usable = free
    if placement == Placement.STRICT_SPREAD:  # one worker per host: not where a kept one is
        usable = {node: gpus for node, gpus in free.items() if node not in kept}
    elif placement == Placement.STRICT_PACK and kept:  # every worker on the one host they share
        usable = {node: gpus for node, gpus in free.items() if node in kept}
    added = plan(usable, moving, gpus_per_worker, placement)
    if added is None:
        kept_gpus = needed - moving * gpus_per_worker
        return Relocation(None, _no_room(free, moving, gpus_per_worker, placement, kept_gpus=kept_gpus))
    merged = dict(kept)
    for node, n in added.items():
        merged[node] = merged.get(node, 0) + n
    return Relocation(merged)


def _no_room(free: Mapping[str, float], moving: int, gpw: float, placement: Placement, *, kept_gpus: float) -> str:
    spare = sum(gpus for gpus in free.values() if gpus > 0)
    lost_gpus = moving * gpw
    if spare + EPSILON >= lost_gpus:
        what = (f"the hosts that remain have {gpus_text(spare)} free, but not where placement='{placement.value}' "
                f"can put {moving} more worker{'s' if moving != 1 else ''} of {gpus_text(gpw)}")
    else:
        what = (f"the hosts that remain have {gpus_text(spare)} free, fewer than the {lost_gpus:g} the run lost "
                f"with the host (it needs {kept_gpus + lost_gpus:g})")
    elastic = f"make the run elastic (min_gpus={kept_gpus:g}) to go on with what remains, or " if kept_gpus else ""
    return f"{what}: {elastic}run it again when GPUs are free"

