"""The node's warm parent is shared: a new kernel's first call forks its ranks from the parent
earlier kernels warmed up (and from the node host's spare workers), and a kernel that dies
leaves nothing of its own running on the node."""
from __future__ import annotations

import os

import psutil
import ray

from gpusession.run.node import nodehost

from ..conftest import CLUSTER_GPUS, free_gpus, process_running, wait_for

PARENTS = """
import os
import gpusession as gs
from gpusession.observe import events
events.set_observer_factory(lambda world_size: events.Observer())

@gs.distributed(gpus=2, return_all=True)
def parents():
    import os
    return os.getpid(), os.getppid()

print("PARENTS", sorted(parent for _, parent in parents()), flush=True)
"""

STUCK = """
import os
import gpusession as gs
from gpusession.observe import events
from gpusession.run.caller.pool import pool
events.set_observer_factory(lambda world_size: events.Observer())

with gs.lease(gpus=2) as lease:  # the kernel's workers, kept in its pool after the lease
    lease.run(lambda: None)
print("WORKERS", *sorted(h.info["pid"] for h in pool().alive(pool().checkout([lease.slots[0].node_id] * 2, None))),
      flush=True)

@gs.distributed(gpus=2, return_all=True)
def stuck(directory):
    import os, time
    open(os.path.join(directory, str(os.getpid())), "w").close()
    time.sleep(600)

stuck(os.environ["RANKS_DIR"])
"""


def _host():
    node_id = ray.get_runtime_context().get_node_id()
    return ray.get_actor(nodehost.host_name(node_id), namespace=nodehost.NAMESPACE)


def test_a_new_kernels_first_call_forks_its_ranks_from_the_nodes_warm_parent(cluster, driver):
    first = driver(PARENTS).wait_for_line("PARENTS", timeout=180)
    zygote = ray.get(_host().info.remote())["zygote_pid"]
    second = driver(PARENTS).wait_for_line("PARENTS", timeout=180)  # another kernel, its first call
    assert first == second == f"PARENTS {[zygote, zygote]}"


def test_a_dead_kernel_leaves_no_rank_and_no_worker_of_its_own(cluster, driver, admin, broker, tmp_path):
    from gpusession.broker import client

    kernel = driver(STUCK, RANKS_DIR=str(tmp_path))
    workers = [int(pid) for pid in kernel.wait_for_line("WORKERS", timeout=180).split()[1:]]
    ranks = wait_for(lambda: len(os.listdir(tmp_path)) == 2 and [int(name) for name in os.listdir(tmp_path)],
                     timeout=120, message="both ranks running")
    zygote = ray.get(_host().info.remote())["zygote_pid"]
    assert {psutil.Process(rank).ppid() for rank in ranks} == {zygote}
    kernel.kill()  # SIGKILL, as the OOM killer does to a kernel
    wait_for(lambda: free_gpus() == CLUSTER_GPUS and not client.call(broker.leases, admin), timeout=30,
             message="its GPUs free in Ray and in the broker")
    wait_for(lambda: not any(process_running(pid) for pid in ranks + workers), timeout=30,
             message="the dead kernel's ranks and worker actors gone")
    assert process_running(zygote)  # the node's warm parent stays, for the next kernel
