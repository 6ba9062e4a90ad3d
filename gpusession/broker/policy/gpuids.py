"""PURE: the GPU ids a lease's caller reports in `placed`, checked against its grant and the
other live leases, before anything is written.

Ray names a node's GPUs "0".."N-1", or by the entries of CUDA_VISIBLE_DEVICES when the node's
raylet was started with it (indices or GPU UUIDs); it publishes no list of them. So an id
"exists on a node" when the node still has room for it: the distinct ids that the live leases
hold on a node never outnumber its GPUs. A whole-GPU worker's id is held by no other lease; ids
of workers with a share of one GPU add up to at most one GPU each.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, NamedTuple

from ...errors import InvalidRequest
from .model import EPSILON

_GPU_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")  # "3", "GPU-5a1f...", "MIG-..."
NodeGpuIds = dict[str, list[list[str]]]  # node id -> one list of GPU ids per worker on that node


class Holder(NamedTuple):
    """Another live lease's GPU ids, as the books recorded them."""

    lease_id: int
    gpus_per_worker: float
    gpu_ids: Mapping[str, list[list[str]]]


def ids_per_worker(gpus_per_worker: float) -> int:
    """A worker with a share of one GPU sees that GPU; one with k whole GPUs sees k."""
    return max(1, math.ceil(gpus_per_worker - EPSILON))


def share(gpus_per_worker: float) -> float:
    """How much of each of its GPUs one worker holds."""
    return min(1.0, gpus_per_worker)


def parse(value: Any, *, node_workers: Mapping[str, int], gpus_per_worker: float) -> NodeGpuIds:
    """The shape: one list per worker on each node of `node_workers`, each with the right number
    of distinct ids. InvalidRequest names the field; nothing has been written."""
    need = ids_per_worker(gpus_per_worker)
    if not isinstance(value, Mapping) or set(value) != set(node_workers):
        raise _refuse("a dict with the same node ids as node_workers "
                      f"({len(node_workers)} node{'s' if len(node_workers) != 1 else ''})", value)
    out: NodeGpuIds = {}
    for node, workers in value.items():
        field = f"gpu_ids[{str(node)[:12]}...]"
        if not isinstance(workers, (list, tuple)) or len(workers) != node_workers[node]:
            raise _refuse(f"a list of {node_workers[node]} workers' GPU ids (node_workers says "
                          f"{node_workers[node]} there)", workers, field)
        out[node] = []
        for ids in workers:
            if (not isinstance(ids, (list, tuple)) or len(ids) != need
                    or not all(isinstance(i, str) and _GPU_ID.match(i) for i in ids) or len(set(ids)) != need):
                raise _refuse(f"{need} distinct GPU id{'s' if need != 1 else ''} per worker (Ray's names, "
                              f"e.g. \"0\"; the lease has {gpus_per_worker:g} GPUs per worker)", ids, field)
            out[node].append([str(i) for i in ids])
    return out


def check_room(lease_id: int, gpu_ids: NodeGpuIds, *, gpus_per_worker: float,
               node_gpus: Mapping[str, float], others: Iterable[Holder]) -> None:
    """No GPU over-full (this lease's workers plus every other live lease on the node), and no
    more distinct GPUs on a node than it has."""
    load: dict[str, dict[str, float]] = {node: {} for node in gpu_ids}
    holders: dict[tuple[str, str], int] = {}
    for other in others:
        if other.lease_id == lease_id:
            continue
        for node, workers in other.gpu_ids.items():
            if node not in load:
                continue
            for ids in workers:
                for gpu in ids:
                    load[node][gpu] = load[node].get(gpu, 0.0) + share(other.gpus_per_worker)
                    holders[node, gpu] = other.lease_id
    for node, workers in gpu_ids.items():
        for ids in workers:
            for gpu in ids:
                load[node][gpu] = load[node].get(gpu, 0.0) + share(gpus_per_worker)
                if load[node][gpu] > 1.0 + EPSILON:
                    held = holders.get((node, gpu))
                    by = f"lease {held} holds it" if held is not None else "this lease's workers over-fill it"
                    raise InvalidRequest(f"gpu_ids names GPU {gpu!r} on node {node[:12]}... more than once: {by}. "
                                         "Report the ids Ray gave each bundle (ray.get_gpu_ids()). Nothing was changed.")
        has = node_gpus.get(node)
        if has is not None and len(load[node]) > has + EPSILON:
            raise InvalidRequest(f"gpu_ids names {len(load[node])} different GPUs on node {node[:12]}... (with the "
                                 f"other leases there) but it has {has:g}: some of them do not exist there. "
                                 "Nothing was changed.")


def _refuse(allowed: str, value: Any, field: str = "gpu_ids") -> InvalidRequest:
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return InvalidRequest(f"{field} must be {allowed}; got {text}. Nothing was changed.")
