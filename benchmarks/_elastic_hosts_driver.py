"""Run by benchmarks/elastic.py on the head of the simulated cluster (RAY_ADDRESS is set).

    python _elastic_hosts_driver.py gpusession LOG STOP
    python _elastic_hosts_driver.py ray-train LOG STOP MONITOR_INTERVAL_S
    python _elastic_hosts_driver.py alive GPUS TIMEOUT_S

gpusession / ray-train: the same elastic DDP loop (min 2, max 4 workers, a checkpoint every step,
the same model and global batch) until the STOP file exists; rank 0 appends one line a step to
LOG: {"world_size", "at", "host"}. gpusession: @gs.distributed(gpus=4, min_gpus=2); Ray Train v2:
TorchTrainer with ScalingConfig(num_workers=(2, 4)), FailureConfig(max_failures=3) and the
given elastic_resize_monitor_interval_s.
alive: polls Ray's node table until its live nodes hold GPUS GPUs; prints when it first saw
that ("Ray lists the host's GPUs alive"), and what it saw first.
Each prints one line `RESULT {json}`.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time

GLOBAL_BATCH = 8


def _batch(step: int):
    import torch

    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 4, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def _one_step(model, opt, step: int, rank: int, world: int) -> None:
    import torch

    x, y = _batch(step)
    shard = GLOBAL_BATCH // world
    loss = torch.nn.functional.mse_loss(model(x[rank * shard:(rank + 1) * shard]), y[rank * shard:(rank + 1) * shard])
    opt.zero_grad()
    loss.backward()
    opt.step()


def _log_and_stop(log: str, stop: str, rank: int, world: int) -> bool:
    """Rank 0 logs the step; every rank learns whether to stop (one all_reduce, as both sides do)."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        with open(log, "a") as f:
            f.write(json.dumps({"world_size": world, "at": time.time(), "host": socket.gethostname()}) + "\n")
    flag = torch.tensor([float(os.path.exists(stop))])
    dist.all_reduce(flag)
    time.sleep(0.05)
    return flag.item() > 0


def gpusession_loop(log: str, stop: str) -> None:
    import torch

    import gpusession as gs

    ctx = gs.context()
    torch.manual_seed(0)
    model = gs.prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = gs.load_checkpoint() or {"step": 0}
    if "model" in state:
        gs.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    step = state["step"]
    while True:
        _one_step(model, opt, step, ctx.rank, ctx.world_size)
        step += 1
        gs.save_checkpoint({"step": step, "model": gs.unwrap(model).state_dict(), "opt": opt.state_dict()})
        if _log_and_stop(log, stop, ctx.rank, ctx.world_size):
            return


def ray_train_loop(config) -> None:
    import ray.train
    import torch
    from ray.train import Checkpoint

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    while True:
        _one_step(model, opt, step, rank, world)
        step += 1
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                torch.save({"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()},
                           os.path.join(folder, "state.pt"))
                checkpoint = Checkpoint.from_directory(folder)
            ray.train.report({"step": step}, checkpoint=checkpoint)
        if _log_and_stop(config["log"], config["stop"], rank, world):
            return


def run_gpusession(log: str, stop: str) -> dict:
    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    call = gs.distributed(gpus=4, min_gpus=2, timeout="1800s")(gpusession_loop)
    call(log, stop)
    info = call.last_run
    return {"restarts": info.restarts, "resizes": info.resizes, "transitions": info.transitions}


def run_ray_train(log: str, stop: str, interval_s: float) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    storage = tempfile.mkdtemp(prefix="raytrain-elastic-hosts-", dir="/tmp")  # one filesystem for every host
    trainer = TorchTrainer(
        ray_train_loop, train_loop_config={"log": log, "stop": stop},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=(2, 4), use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0},
                                     elastic_resize_monitor_interval_s=interval_s),
        run_config=RunConfig(storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    try:
        trainer.fit()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {}


def alive(gpus: float, timeout_s: float) -> dict:
    import ray

    ray.init(logging_level="ERROR")
    first, deadline = None, time.time() + timeout_s
    while time.time() < deadline:
        now = time.time()
        total = sum(n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"])
        if first is None:
            first = total
            print(f"WATCHING {total:g} GPUs alive", flush=True)  # the benchmark restarts the host only now
        if total >= gpus:
            return {"alive_at": now, "first_total": first}
        time.sleep(0.1)
    return {"alive_at": None, "first_total": first}


def main() -> None:
    mode = sys.argv[1]
    if mode == "gpusession":
        out = run_gpusession(sys.argv[2], sys.argv[3])
    elif mode == "ray-train":
        os.environ["RAY_TRAIN_V2_ENABLED"] = "1"  # elastic training is Ray Train v2's; before ray.train is imported
        out = run_ray_train(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        out = alive(float(sys.argv[2]), float(sys.argv[3]))
    print("RESULT " + json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
