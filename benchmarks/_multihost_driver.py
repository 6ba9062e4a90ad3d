"""Run by benchmarks/multihost.py on the head of the simulated cluster (RAY_ADDRESS is set).

    python _multihost_driver.py calls REPEATS FITS
    python _multihost_driver.py node-loss MARKER_FILE
    python _multihost_driver.py node-loss-raytrain MARKER_FILE [WORKERS]
    python _multihost_driver.py move MARKER_FILE
    python _multihost_driver.py whole GPUS TIMEOUT_S
    python _multihost_driver.py data-gpusession MB | data-ray MB

Prints one line `RESULT {json}` with absolute times (time.time(): every simulated host shares
the machine's clock, so the benchmark can subtract the moment it killed a host).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

import gpusession as gs
from gpusession.observe import events


def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def gpusession_calls(repeats: int) -> dict:
    from gpusession.broker import client

    client.broker()  # the cluster's broker exists (as it would for any kernel but the first)
    call = gs.distributed(gpus=4, placement="spread")(allreduce)
    started = time.perf_counter()
    assert call() == 4.0
    first = time.perf_counter() - started
    hosts = call.last_run.nodes
    repeat = []
    for _ in range(repeats):
        started = time.perf_counter()
        assert call() == 4.0
        repeat.append(time.perf_counter() - started)
    return {"first_s": first, "repeat_s": repeat, "repeat_median_s": statistics.median(repeat) if repeat else None,
            "nodes": hosts}


def ray_pool_calls(repeats: int) -> dict:
    """The long-lived pool (benchmarks/_ray_pool.py): 4 actors, one GPU each (on 2 hosts of 2 GPUs
    they spread by themselves), their gloo group formed once; "first" is making the pool and its
    first call, the repeats are calls of the pool that holds its GPUs between them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ray_pool import RayPool

    started = time.perf_counter()
    pool = RayPool(4)
    try:
        assert pool.run(_pool_allreduce) == [4.0] * 4
        first = time.perf_counter() - started
        hosts = sorted(set(pool.run(_pool_host)))
        repeat = []
        for _ in range(repeats):
            started = time.perf_counter()
            assert pool.run(_pool_allreduce) == [4.0] * 4
            repeat.append(time.perf_counter() - started)
    finally:
        pool.shutdown()
    return {"first_s": first, "repeat_s": repeat, "repeat_median_s": statistics.median(repeat) if repeat else None,
            "nodes": hosts}


def _pool_allreduce(rank: int, world_size: int) -> float:
    return allreduce()


def _pool_host(rank: int, world_size: int) -> str:
    import socket

    return socket.gethostname()


def ray_train_fits(fits: int) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    storage = tempfile.mkdtemp(prefix="raytrain-multihost-", dir="/tmp")  # one filesystem for every host

    def loop():
        allreduce()

    durations = []
    try:
        for _ in range(fits):
            trainer = TorchTrainer(
                loop, torch_config=TorchConfig(backend="gloo"),
                scaling_config=ScalingConfig(num_workers=4, use_gpu=True, placement_strategy="SPREAD",
                                             resources_per_worker={"GPU": 1, "CPU": 0}),
                run_config=RunConfig(storage_path=storage),
            )
            started = time.perf_counter()
            trainer.fit()
            durations.append(time.perf_counter() - started)
    finally:
        shutil.rmtree(storage, ignore_errors=True)  # its runs' records: nothing stays in /tmp
    return {"first_s": durations[0], "repeat_s": durations[1:],
            "repeat_median_s": statistics.median(durations[1:]) if fits > 1 else None}


def steps_until_stopped(marker: str):
    """Allreduce steps for as long as the run lives; rank 0 names its host once running."""
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    for step in range(1_000_000):
        value = torch.ones(1)
        dist.all_reduce(value)
        if step == 20 and ctx.rank == 0:
            with open(marker, "w") as f:
                f.write(json.dumps({"host": socket.gethostname(), "time": time.time()}))
        time.sleep(0.02)


def node_loss(marker: str) -> dict:
    result: dict = {}
    call = gs.distributed(gpus=4, placement="spread", timeout="600s")(steps_until_stopped)
    try:
        call(marker)
    except BaseException as exc:  # what the user sees, whatever it is
        result["error_time"] = time.time()
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)[:3000]
    result["run_info"] = {k: getattr(call.last_run, k) for k in ("gpu_seconds", "setup_s", "run_s", "end_reason")}
    watcher = threading.Thread(target=_watch_capacity, args=(result, 120.0), daemon=True)
    watcher.start()
    result["next_request"] = _four_gpu_request()
    watcher.join()
    return result


def _four_gpu_request() -> dict:
    asked = time.time()
    call = gs.distributed(gpus=4, queue_timeout="60s", timeout="120s")(allreduce)
    out: dict = {"asked": asked}
    try:
        out["value"] = call()
    except BaseException as exc:
        out["error_type"] = type(exc).__name__
        out["error"] = str(exc)[:1500]
    out["ended"] = time.time()
    info = call.last_run
    out["run_info"] = {k: getattr(info, k) for k in ("queued_s", "setup_s", "run_s", "gpu_seconds", "end_reason")}
    return out


def _watch_capacity(result: dict, seconds: float) -> None:
    """When Ray marks a node dead, and when Ray and the broker show the surviving GPUs free."""
    from ray._private.state import available_resources_per_node

    deadline, samples = time.time() + seconds, []
    while time.time() < deadline:
        now = time.time()
        nodes = [n for n in ray.nodes() if n["Resources"].get("GPU")]
        per_node = available_resources_per_node()
        cluster = gs.status().cluster
        samples.append({"t": now, "alive": {n["NodeManagerAddress"]: n["Alive"] for n in nodes},
                        "free": {n["NodeManagerAddress"]: per_node.get(n["NodeID"], {}).get("GPU", 0.0)
                                 for n in nodes if n["Alive"]},
                        "broker_total": cluster["gpus_total"], "broker_free": cluster["gpus_free"],
                        "broker_leased": cluster["gpus_leased"]})
        time.sleep(0.2)
    result["samples"] = samples


def checkpointed_steps(marker: str, steps_after: int = 20):
    """Checkpoints every step; rank 0 names its host once running. The first attempt goes on
    until a host is lost under it; the next makes steps_after more steps. Reports when each
    step was made, and in which attempt."""
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    step = (gs.load_checkpoint() or {"step": 0})["step"]
    end = None if ctx.attempt == 0 else step + steps_after
    while end is None or step < end:
        dist.all_reduce(torch.ones(1))
        gs.report(step=step, attempt=ctx.attempt, at=time.time())
        step += 1
        gs.save_checkpoint({"step": step})
        if step == 20 and ctx.attempt == 0 and ctx.rank == 0:
            with open(marker, "w") as f:
                f.write(json.dumps({"host": socket.gethostname(), "time": time.time()}))
        time.sleep(0.02)
    return step


class Transitions(events.Observer):
    """Each restart line with the time it was told (the cell would show it then)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def transition(self, info, line: str) -> None:
        self.lines.append((time.time(), line))


def move(marker: str) -> dict:
    """A 2-rank spread run (one rank per host) that loses the host without rank 0: when is the
    restart told, and when is the next step made (on the host that remains)?"""
    transitions = Transitions()
    events.set_observer_factory(lambda world_size: transitions)
    call = gs.distributed(gpus=2, placement="spread", timeout="600s")(checkpointed_steps)
    result: dict = {}
    try:
        result["value"] = call(marker)
    except BaseException as exc:
        result["error_time"] = time.time()
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)[:3000]
    info = call.last_run
    result["transitions"] = transitions.lines
    result["next_step"] = next((r["at"] for r in info.history if r.get("attempt", 0) > 0), None)
    result["run_info"] = {k: getattr(info, k) for k in ("gpu_seconds", "setup_s", "run_s", "restarts", "nodes")}
    return result


def ray_train_node_loss(marker: str, workers: int = 4, max_failures: int = 0) -> dict:
    """The same loop under TorchTrainer (workers SPREAD, FailureConfig(max_failures)): when does the
    driver hear of the lost host, as an error (max_failures=0, what a run that cannot go on on the
    GPUs left should get) or as the restarted run's first step (max_failures=1, a run that moves)?"""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Beside the marker, in the simulated cluster's own folder: the benchmark stops this driver
    # (its process group) once it has what it measures, so the `finally` below may never run, and
    # the cluster's teardown removes that folder whatever happened.
    storage = tempfile.mkdtemp(prefix="raytrain-nodeloss-", dir=os.path.dirname(marker))

    def loop():
        import os
        import socket

        import ray.train
        import torch
        import torch.distributed as dist

        rank0 = ray.train.get_context().get_world_rank() == 0
        restarted = os.path.exists(marker)  # the first run wrote it: this is the restart
        for step in range(20 if restarted else 1_000_000):
            dist.all_reduce(torch.ones(1))
            path = marker + ".restarted" if restarted and step == 0 else marker if step == 20 else None
            if rank0 and path:
                with open(path, "w") as f:
                    f.write(json.dumps({"host": socket.gethostname(), "time": time.time()}))
            time.sleep(0.02)

    trainer = TorchTrainer(
        loop, torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=True, placement_strategy="SPREAD",
                                     resources_per_worker={"GPU": 1, "CPU": 0}),
        run_config=RunConfig(storage_path=storage, failure_config=FailureConfig(max_failures=max_failures)),
    )
    result: dict = {}
    try:
        trainer.fit()
    except BaseException as exc:
        result["error_time"] = time.time()
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)[:1500]
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return result


def whole(gpus: int, timeout_s: float) -> dict:
    """Wait until Ray shows `gpus` GPUs on live nodes, every one of them free (no run of the try
    before holds any): each try starts on the whole cluster. A host Ray declared dead comes back
    only as a new node (its restarted raylet), so this waits for that node, not the old one."""
    from ray._private.state import available_resources_per_node

    ray.init(logging_level="ERROR")  # RAY_ADDRESS: this cluster
    started = time.time()
    deadline = started + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
        per_node = available_resources_per_node()
        total = sum(n["Resources"]["GPU"] for n in alive)
        free = sum(per_node.get(n["NodeID"], {}).get("GPU", 0.0) for n in alive)
        if (total, free) == (gpus, gpus) or time.time() > deadline:
            return {"whole": (total, free) == (gpus, gpus), "waited_s": time.time() - started, "total": total,
                    "free": free, "nodes": {n["NodeManagerAddress"]: n["NodeID"][:8] for n in alive}}
        time.sleep(0.5)


def _argument(mb: int):
    import numpy as np

    return np.ones(max(1, mb * 2**20 // 8))  # float64: mb MiB (one element for 0, the baseline call)


def _seen(data) -> tuple[str, float]:
    import socket

    return socket.gethostname(), float(data[::4096].sum())  # every page of it read? a strided sum is enough


def data_gpusession(mb: int) -> dict:
    """One 4-rank call spread over the 2 hosts whose argument is an `mb` MiB array (2 ranks per host)."""
    from gpusession.broker import client

    client.broker()
    data = _argument(mb)
    call = gs.distributed(gpus=4, placement="spread", return_all=True)(_seen)
    started = time.perf_counter()
    seen = call(data)
    return {"seconds": time.perf_counter() - started, "seen": seen, "nodes": call.last_run.nodes,
            "shipped_bytes": call.last_run.shipped_bytes}


@ray.remote(num_gpus=1, num_cpus=0)  # no CPU, as the other sides ask (a host has 1 CPU here)
class _Reader:
    def read(self, data) -> tuple[str, float]:
        return _seen(data)


def data_ray(mb: int) -> dict:
    """Ray's own way: `ray.put` once, 4 actors holding a GPU each (SPREAD: 2 per host) read it."""
    ray.init(logging_level="ERROR")
    data = _argument(mb)
    readers = [_Reader.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]
    ray.get([r.__ray_ready__.remote() for r in readers])
    started = time.perf_counter()
    ref = ray.put(data)
    seen = ray.get([r.read.remote(ref) for r in readers])
    seconds = time.perf_counter() - started
    for reader in readers:
        ray.kill(reader)
    return {"seconds": seconds, "seen": seen}


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())
    mode = sys.argv[1]
    if mode == "calls":
        # one after another: each takes all 4 GPUs of the 2 hosts while it runs
        out = {"gpusession": gpusession_calls(int(sys.argv[2])), "ray_pool": ray_pool_calls(int(sys.argv[2])),
               "ray_train": ray_train_fits(int(sys.argv[3]))}
    elif mode == "node-loss-raytrain":
        out = ray_train_node_loss(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4,
                                  int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    elif mode == "first":  # one side's first call in this new driver, nothing else
        side = sys.argv[2]
        out = {"first_s": (gpusession_calls(0) if side == "gpusession" else ray_train_fits(1))["first_s"]}
    elif mode == "whole":
        out = whole(int(sys.argv[2]), float(sys.argv[3]))
    elif mode == "data-gpusession":
        out = data_gpusession(int(sys.argv[2]))
    elif mode == "data-ray":
        out = data_ray(int(sys.argv[2]))
    elif mode == "move":
        out = move(sys.argv[2])
    else:
        out = node_loss(sys.argv[2])
    print("RESULT " + json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
