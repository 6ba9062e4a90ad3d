"""Run by test_multinode.py in its own process: a 3-node Ray cluster on this machine
(ray.cluster_utils.Cluster: a head without GPUs and two nodes of 2 logical GPUs each)."""
from __future__ import annotations

import json
import os
import sys
import tempfile

from ray.cluster_utils import Cluster

import gpusession as gs
from gpusession import events

os.environ["GPUSESSION_HOME"] = tempfile.mkdtemp(prefix="gpusession-multinode-")
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
cluster.wait_for_nodes()
import ray  # noqa: E402

ray.init(address=cluster.address)
events.set_observer_factory(lambda world_size: events.Observer())
report: dict = {}


def where():
    ctx = gs.context()
    return {"rank": ctx.rank, "node_rank": ctx.node_rank, "local_rank": ctx.local_rank,
            "local_world_size": ctx.local_world_size, "node": ray.get_runtime_context().get_node_id(),
            "visible": os.environ["CUDA_VISIBLE_DEVICES"], "world_size": ctx.world_size}


def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0])
    dist.all_reduce(value)
    return value.item()


report["spread"] = gs.distributed(gpus=4, placement="spread", return_all=True)(where)()
report["allreduce_across_nodes"] = gs.distributed(gpus=4)(allreduce)()
try:
    gs.distributed(gpus=3, placement="strict_pack")(where)()
except gs.Infeasible as exc:
    report["strict_pack_3"] = str(exc)
report["strict_pack_2"] = gs.distributed(gpus=2, placement="strict_pack", return_all=True)(where)()
report["free_after"] = ray.available_resources().get("GPU", 0.0)
ray.shutdown()
cluster.shutdown()
json.dump(report, open(sys.argv[1], "w"))
