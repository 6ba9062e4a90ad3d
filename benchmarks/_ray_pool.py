"""The warm Ray baseline: what a Ray expert writes for repeated DDP calls from a notebook.

N actors with one GPU each form a torch process group once (nccl on CUDA, else gloo) and then
run one method per call; between calls they hold their GPUs and their process group. For faults,
as Ray's docs for fault-tolerant actors show: each actor has `max_restarts`, so Ray starts a
dead one again (its __init__ runs anew); Ray does not restore the actor's state, so the pool
forms the process group again on every rank, the restarted one and the survivors.

    pool = RayPool(2)          # 2 actors, 2 GPUs held from now on
    pool.run(allreduce)        # fn(rank, world_size) on every rank; a list of the ranks' results
    pool.recover()             # after an actor died: wait for Ray's restart, form the group again
    pool.shutdown()            # the GPUs go back
"""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import ray

PROCESS_GROUP_TIMEOUT_S = 60
BENCHMARKS = Path(__file__).resolve().parent


@ray.remote(num_gpus=1, num_cpus=0, max_restarts=-1, max_task_retries=0)  # no CPU, as the other sides ask
class PoolRank:
    """One rank: holds its GPU and, once formed, its torch process group."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.incarnation = time.time()  # a restarted actor has a new one

    def ready(self) -> float:
        return self.incarnation

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the group's rendezvous (a free port on its node)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def form_group(self, host: str, port: int) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))

    def run(self, fn, args: tuple = ()):
        return fn(self.rank, self.world_size, *args)


class RayPool:
    """N PoolRank actors with their process group formed; `run` is one call of the pool."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.actors = [PoolRank.remote(rank, size) for rank in range(size)]
        ray.get([actor.ready.remote() for actor in self.actors])
        self.form_group()

    def form_group(self) -> None:
        host, port = ray.get(self.actors[0].address.remote())
        ray.get([actor.form_group.remote(host, port) for actor in self.actors])

    def run(self, fn, *args) -> list:
        _ship_by_value(fn)
        return ray.get([actor.run.remote(fn, args) for actor in self.actors])

    def recover(self, *, timeout_s: float = 120.0) -> None:
        """After an actor died: wait until Ray has restarted it (max_restarts), then form the
        process group again on every rank (the survivors' group lost a member)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get([actor.ready.remote() for actor in self.actors], timeout=max(1.0, deadline - time.monotonic()))
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.form_group()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def _ship_by_value(fn) -> None:
    """A function of a benchmark module travels as code: the actors cannot import benchmarks/."""
    module = sys.modules.get(getattr(fn, "__module__", ""))
    if module is not None and Path(getattr(module, "__file__", "") or "/").resolve().parent == BENCHMARKS:
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)
