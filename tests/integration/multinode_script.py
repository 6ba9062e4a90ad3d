"""Run by test_multinode.py in its own process: a 3-node Ray cluster on this machine
(ray.cluster_utils.Cluster: a head without GPUs and two nodes of 2 logical GPUs each)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile

from ray.cluster_utils import Cluster

import gpusession as gs
from gpusession.observe import events
from gpusession.run.node import warmdir

WORK = tempfile.mkdtemp(prefix="gpusession-multinode-")  # the ledger and the marker; removed at exit
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
# A socket folder a node host left when Ray ended it, long ago (no lock: an older version's): the
# first host started on this cluster's nodes removes it.
PLANTED = tempfile.mkdtemp(prefix=f"{warmdir.PREFIX}planted-")
atexit.register(shutil.rmtree, PLANTED, ignore_errors=True)
os.utime(PLANTED, (0, 0))
os.environ["GPUSESSION_HOME"] = WORK
# No dashboard, as gpusession's own heads run (its forkserver's /tmp/pymp-* folder outlived every
# run of this script: the dashboard is killed, never stopped)
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False})
nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
cluster.wait_for_nodes()
import ray  # noqa: E402

ray.init(address=cluster.address)
events.set_observer_factory(lambda world_size: events.Observer())
report: dict = {}


def where():
    ctx = gs.context()
    return {"rank": ctx.rank, "node_rank": ctx.node_rank, "local_rank": ctx.local_rank,
            "local_world_size": ctx.local_world_size, "node": ctx.node_id,
            "visible": os.environ["CUDA_VISIBLE_DEVICES"], "world_size": ctx.world_size}


def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0])
    dist.all_reduce(value)
    return value.item()


report["spread"] = gs.distributed(gpus=4, placement="spread", return_all=True)(where)()


def forked_by():
    return gs.context().node_id, os.getppid()


# Warm across nodes: every rank of a spread call, its repeat included, is forked by its node's
# one warm parent (the node host's zygote), shared by every kernel and placement on that node.
spread_parents = gs.distributed(gpus=4, placement="spread", return_all=True)(forked_by)
from gpusession.run.node import nodehost  # noqa: E402

report["spread_parents"] = [spread_parents(), spread_parents()]
host_info = {node.node_id: ray.get(ray.get_actor(nodehost.host_name(node.node_id), namespace=nodehost.NAMESPACE)
                                   .info.remote()) for node in nodes}
report["node_zygotes"] = {node_id: info["zygote_pid"] for node_id, info in host_info.items()}
warm_dirs = {node_id: info["warm_dir"] for node_id, info in host_info.items()}
report["warm_dirs"] = {"planted_gone": not os.path.exists(PLANTED),
                       "swept_while_hosts_live": [d for d in warmdir.sweep() if d in warm_dirs.values()],
                       "live": [os.path.isdir(d) for d in warm_dirs.values()]}
report["allreduce_across_nodes"] = gs.distributed(gpus=4)(allreduce)()
try:
    gs.distributed(gpus=3, placement="strict_pack")(where)()
except gs.Infeasible as exc:
    report["strict_pack_3"] = str(exc)
report["strict_pack_2"] = gs.distributed(gpus=2, placement="strict_pack", return_all=True)(where)()
report["free_after"] = ray.available_resources().get("GPU", 0.0)


class BusyAtStep(events.Observer):
    """A caller busy when a step's report arrives (a notebook drawing its plot; as slow as a large
    checkpoint crossing the network), until `done` is set or for `at_most_s`."""

    def __init__(self, step: int, done, at_most_s: float) -> None:
        self.step, self.done, self.at_most_s = step, done, at_most_s

    def report(self, metrics: dict, info) -> None:
        if metrics.get("step") == self.step and info.restarts == 0:
            self.done.wait(self.at_most_s)


def node_loss() -> dict:
    """A 2-GPU run on one node, checkpointing 4 MB (kept in an object store, not inlined) every
    step; that node, rank 0's, is removed right after step 5's commit while the caller is busy;
    the run must finish on the other node from step 5's checkpoint with the weights of an
    uninterrupted run. Rank 0's save_checkpoint returns only once the caller holds its own copy:
    if it returned before (the copy still only on the lost node), the restart would go back to
    step 4's checkpoint."""
    import threading
    import time

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from recovery_train import train

    run = gs.distributed(gpus=2, placement="strict_pack")(train)
    expected = run()
    marker = os.path.join(WORK, "held")
    removed, gone = {}, threading.Event()

    def remove_the_node_when_told():
        while not os.path.exists(marker):
            time.sleep(0.05)
        node_id, _ = open(marker).read().split()
        [node] = [n for n in nodes if n.node_id == node_id]
        removed["at"], removed["node_id"] = time.time(), node_id
        cluster.remove_node(node)
        gone.set()

    remover = threading.Thread(target=remove_the_node_when_told, daemon=True)
    remover.start()
    run.observer = BusyAtStep(5, gone, at_most_s=3.0)
    resumed = run(hold_at_step=5, marker=marker, ballast_mb=4)
    info = run.last_run
    return {"same_weights": all(torch.equal(expected[k], resumed[k]) for k in expected),
            "restarts": info.restarts, "transitions": info.transitions, "steps_lost": info.steps_lost,
            "steps": [r["step"] for r in info.history], "attempts": [r["attempt"] for r in info.history],
            "node_removed": bool(removed),
            "removed_node": removed.get("node_id", ""),
            "first_step_after_s": info.history[6]["at"] - removed.get("at", 0.0),
            "free_after": ray.available_resources().get("GPU", 0.0)}


def swept(folders: set, within_s: float = 30.0) -> bool:
    """Whether sweeps remove every one of these folders within the time (their hosts' processes
    may take a moment to exit once Ray ends them)."""
    import time

    left, deadline = set(folders), time.monotonic() + within_s
    while left and time.monotonic() < deadline:
        left -= set(warmdir.sweep())
        time.sleep(0.2)
    return not left


report["node_loss"] = node_loss()
lost_dir = warm_dirs[report["node_loss"]["removed_node"]]
report["warm_dirs"]["lost_node_left"] = os.path.isdir(lost_dir)
report["warm_dirs"]["lost_node_swept"] = swept({lost_dir})  # its host's lock went with its process
ray.shutdown()
cluster.shutdown()
report["warm_dirs"]["after_cluster_swept"] = swept(set(warm_dirs.values()) - {lost_dir})
json.dump(report, open(sys.argv[1], "w"))
