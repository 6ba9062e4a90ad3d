"""GPUs free again -> an elastic run back at full size: gpusession vs Ray Train v2's elastic
training (ScalingConfig(num_workers=(min, max))), the same DDP loop on the same cluster (4 logical
GPUs, gloo), measured side by side in one run.

    .venv/bin/python benchmarks/elastic.py [--repeat 3] [--ray-repeat 1] [--ray-interval 60]

gpusession: run A (gpus=4, min_gpus=2, low priority, checkpoint every step) trains; a high
priority lease of 2 GPUs preempts it (A shrinks to 2 and goes on), holds them for a few seconds
and releases them; measured from the release's return to the end of A's first step at 4 GPUs.

Ray Train: its elastic policy counts the GPUs of the cluster's nodes (Ray Data's
AutoscalingCoordinator reads each node's total resources), not what other jobs hold: with 2 of
4 GPUs held by another job's placement group it tries 4 workers, times out after 60 s
(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) and tries 4 again; it never runs at 2. So it cannot
take part in the shared-cluster scenario. Its elastic resize works when the cluster grows: here a
`ray.cluster_utils.Cluster` of a 2-GPU head, the trainer starts at 2 workers, then a second node
with 2 GPUs joins; measured from the node's join to the end of the first step at 4 workers. Ray
Train decides resizes every `elastic_resize_monitor_interval_s` (60 s by default, what users
get); gpusession hears of free GPUs from the broker at once. Target: gpusession <= 10 s, ratio
<= 0.3.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _cluster import local_cluster, median  # noqa: E402

HOLD_S = 3.0  # how long the high-priority lease keeps its 2 GPUs


def gpusession_regrow_s(work: str) -> float:
    from gpusession.broker import client
    from gpusession.events import Observer, RunInfo
    from gpusession.identity import Identity
    from gpusession.cluster.lease import Lease
    from gpusession.options import validate_run_options
    from tests.integration.elastic_train import train

    broker = client.broker()  # started here: its admin token is written beside its ledger
    client.call(broker.set_quota, "boss", {"max_priority": "high"}, {"token": client.admin_token_here(),
                                                                      "user": "admin"})
    stop = os.path.join(work, "stop")
    info = RunInfo()
    elastic = Lease(validate_run_options(gpus=4, min_gpus=2, priority="low"), identity=Identity("elastic"),
                    info=info, observer=Observer())
    thread = threading.Thread(target=lambda: elastic.acquire().run(train, stop) and None)
    thread.start()
    try:
        _wait(lambda: len(info.history) >= 3, "gpusession run at 4 GPUs")
        high = Lease(validate_run_options(gpus=2, priority="high"), identity=Identity("boss")).acquire()
        _wait(lambda: info.history[-1]["world_size"] == 2, "gpusession run at 2 GPUs")
        time.sleep(HOLD_S)
        high.release()
        freed = time.time()
        _wait(lambda: info.history[-1]["world_size"] == 4, "gpusession run back at 4 GPUs")
    finally:
        open(stop, "w").close()
        thread.join(120)
        elastic.release()
    back = next(r["at"] for r in info.history if r["at"] > freed and r["world_size"] == 4)
    return back - freed


def ray_train_regrow_s(work: str, interval_s: float) -> float:
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    from ray.cluster_utils import Cluster
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    log_path = os.path.join(work, "ray-train-steps.jsonl")
    stop = os.path.join(work, "ray-stop")

    def train_loop(config):
        import ray.train
        import torch
        import torch.distributed as dist

        context = ray.train.get_context()
        rank, world = context.get_world_rank(), context.get_world_size()
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        step = 0
        while True:
            x = torch.randn(8 // world, 4, generator=torch.Generator().manual_seed(step * 10 + rank))
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                with open(config["log"], "a") as f:
                    f.write(json.dumps({"world_size": world, "at": time.time()}) + "\n")
            flag = torch.tensor([float(os.path.exists(config["stop"]))])
            dist.all_reduce(flag)
            if flag.item() > 0:
                return
            ray.train.report({"step": step})
            step += 1
            time.sleep(0.05)

    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_gpus": 2, "num_cpus": 2})
    trainer = TorchTrainer(
        train_loop, train_loop_config={"log": log_path, "stop": stop},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=(2, 4), use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0},
                                     elastic_resize_monitor_interval_s=interval_s),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="raytrain-elastic-")),
    )
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("fit", trainer.fit()))
    thread.start()
    freed = None
    try:
        _wait(lambda: _ray_sizes(log_path)[-3:] == [2, 2, 2], "Ray Train at 2 workers", timeout=300)
        cluster.add_node(num_gpus=2, num_cpus=2)
        cluster.wait_for_nodes()
        freed = time.time()
        _wait(lambda: 4 in _ray_sizes(log_path), "Ray Train back at 4 workers", timeout=interval_s * 3 + 120)
    finally:
        open(stop, "w").close()
        thread.join(300)
        import ray

        ray.shutdown()
        cluster.shutdown()
    entries = [json.loads(line) for line in open(log_path)]
    return next(e["at"] for e in entries if e["at"] > freed and e["world_size"] == 4) - freed


def _ray_sizes(path: str) -> list[int]:
    if not os.path.exists(path):
        return []
    return [json.loads(line)["world_size"] for line in open(path) if line.strip()]


def _wait(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not _safe(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.02)


def _safe(predicate) -> bool:
    try:
        return bool(predicate())
    except (IndexError, KeyError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="regrowths to time on gpusession's side")
    parser.add_argument("--ray-repeat", type=int, default=1, help="regrowths to time on Ray Train's side")
    parser.add_argument("--ray-interval", type=float, default=60.0,
                        help="Ray Train's elastic_resize_monitor_interval_s (its default: 60)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpusession-elastic-")
    with local_cluster():
        gs_runs = [gpusession_regrow_s(tempfile.mkdtemp(dir=work)) for _ in range(args.repeat)]
    print(f"gpusession: GPUs free -> first step at 4 GPUs, median {median(gs_runs):.2f} s over "
          f"{len(gs_runs)} ({', '.join(f'{s:.2f}' for s in gs_runs)})", flush=True)
    rt_runs = [ray_train_regrow_s(tempfile.mkdtemp(dir=work), args.ray_interval) for _ in range(args.ray_repeat)]
    print(f"Ray Train v2 elastic (num_workers=(2, 4), elastic_resize_monitor_interval_s={args.ray_interval:g}): "
          f"a 2-GPU node joins -> first step at 4 workers, median {median(rt_runs):.2f} s over {len(rt_runs)} "
          f"({', '.join(f'{s:.2f}' for s in rt_runs)})")
    print(f"ratio gpusession/ray_train: {median(gs_runs) / median(rt_runs):.3f} (target <= 0.3)")


if __name__ == "__main__":
    main()
