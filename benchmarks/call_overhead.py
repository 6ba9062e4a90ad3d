"""Call-to-result of a trivial 2-worker allreduce: @gs.distributed on a warm cluster vs Ray
Train's TorchTrainer.fit() (gloo, the same logical GPUs), and the first call of a new Python
process vs `torchrun` cold on the same function, measured side by side in one run.

    .venv/bin/python benchmarks/call_overhead.py [--calls 20] [--fits 2] [--cold 3]

Both sides reserve 2 GPUs, start 2 ranks with a gloo process group, all-reduce one tensor and
return. Every call of gpusession forks 2 fresh rank processes from the node's warm parent (torch
already imported); a new process's first call takes spare worker actors from the node host, so it
starts no process of its own (nodehost.py). Ray Train starts a trainer, a controller and fresh
workers on every fit(). The first calls and the torchrun runs alternate, so load from elsewhere
on the machine falls on both alike. Targets: warm median <= 0.2 s, ratio to Ray Train <= 0.10;
a new process's first call no slower than torchrun cold (ratio <= 1.0, printed last).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster, median, timed  # noqa: E402


def gpusession_call_seconds(calls: int) -> list[float]:
    import gpusession as gs
    from gpusession import events

    events.set_observer_factory(lambda world_size: events.Observer())  # measure the call, not printing

    @gs.distributed(gpus=2)
    def allreduce():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item()

    cold = timed(lambda: allreduce() == 2.0 or sys.exit("wrong result"), 1)[0]  # starts broker and node host
    allreduce()
    return cold, timed(allreduce, calls)


def ray_train_fit_seconds(fits: int) -> list[float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def train_loop():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)

    storage = tempfile.mkdtemp(prefix="raytrain-bench-")

    def fit():
        trainer = TorchTrainer(
            train_loop,
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0}),
            run_config=RunConfig(storage_path=storage),
        )
        trainer.fit()

    return timed(fit, fits)


_FIRST_CALL = """
import time
started = time.perf_counter()
import gpusession as gs
from gpusession import events
events.set_observer_factory(lambda world_size: events.Observer())

@gs.distributed(gpus=2)
def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()

assert allreduce() == 2.0
print("SECONDS", time.perf_counter() - started)
"""

_TORCHRUN_SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == 2.0
dist.destroy_process_group()
"""


def first_call_seconds() -> float:
    """A new Python process (a fresh kernel) that joins the running cluster and calls once:
    import, connect, lease, start ranks, result."""
    import subprocess

    import ray

    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return float(out.split("SECONDS", 1)[1])


def torchrun_cold_seconds() -> float:
    import subprocess

    script = os.path.join(tempfile.mkdtemp(prefix="torchrun-cold-"), "allreduce.py")
    with open(script, "w") as f:
        f.write(_TORCHRUN_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script]
    return timed(lambda: subprocess.run(command, check=True, capture_output=True, timeout=300), 1)[0]


def first_calls_and_torchrun(runs: int) -> tuple[list[float], list[float]]:
    """Alternating, so a burst of load from elsewhere does not fall on one side only."""
    firsts, torchruns = [], []
    for _ in range(runs):
        firsts.append(first_call_seconds())
        torchruns.append(torchrun_cold_seconds())
    return firsts, torchruns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="warm @gs.distributed calls to time")
    parser.add_argument("--fits", type=int, default=2, help="TorchTrainer.fit() calls to time")
    parser.add_argument("--cold", type=int, default=3, help="first calls of new processes, and torchrun runs")
    args = parser.parse_args()
    with local_cluster():
        cluster_first, gs_times = gpusession_call_seconds(args.calls)
        rt_times = ray_train_fit_seconds(args.fits)
        first_times, torchrun_times = first_calls_and_torchrun(args.cold)
    gs_median, rt_median = median(gs_times), median(rt_times)
    first_median, torchrun_median = median(first_times), median(torchrun_times)
    print(f"machine load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores")
    print(f"first call on a fresh cluster (starts the broker and the node host): {cluster_first:.2f} s")
    print(f"@gs.distributed(gpus=2), warm: median {gs_median:.3f} s over {len(gs_times)} calls "
          f"(min {min(gs_times):.3f}, max {max(gs_times):.3f}; target <= 0.2 s)")
    print(f"TorchTrainer.fit(), 2 workers: median {rt_median:.2f} s over {len(rt_times)} fits "
          f"(min {min(rt_times):.2f}, max {max(rt_times):.2f})")
    print(f"first call of a new process (import, connect, lease, 2 fresh ranks): "
          f"{', '.join(f'{t:.2f}' for t in first_times)} s, median {first_median:.2f} s")
    print(f"torchrun cold, same function, alternating with those: "
          f"{', '.join(f'{t:.2f}' for t in torchrun_times)} s, median {torchrun_median:.2f} s")
    print(f"ratio gpusession/ray_train, warm call: {gs_median / rt_median:.4f} (target <= 0.10)")
    print(f"ratio first call of a new process / torchrun cold: {first_median / torchrun_median:.2f} "
          "(target <= 1.0)")


if __name__ == "__main__":
    main()
