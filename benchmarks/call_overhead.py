"""Call-to-result of a trivial 2-worker allreduce: @gs.distributed on a warm cluster vs Ray
Train's TorchTrainer.fit() (gloo, the same logical GPUs), and the first call of a new Python
process vs `torchrun` cold on the same function, measured side by side in one run.

    .venv/bin/python benchmarks/call_overhead.py [--rounds 3] [--calls 5] [--cold 3]

Both sides reserve 2 GPUs, start 2 ranks with a gloo process group, all-reduce one tensor and
return. Every call of gpusession forks 2 fresh rank processes from the node's warm parent (torch
already imported); a new process's first call takes spare worker actors from the node host, so it
starts no process of its own (nodehost.py). Ray Train starts a trainer, a controller and fresh
workers on every fit(). Warm-up alike: each side's first call is discarded; warm calls and fit()s
alternate in rounds, first calls of new processes and torchrun runs alternate, and both of those
are timed from outside as whole subprocesses, so load from elsewhere falls on both sides alike.
Writes benchmarks/results/call_overhead.json. Targets: warm median <= 0.2 s, ratio to Ray Train <= 0.10;
a new process's first call no slower than torchrun cold (ratio <= 1.0, printed last).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster, median, timed  # noqa: E402
from _results import Row, spread, write  # noqa: E402


def gpusession_call():
    """The warm @gs.distributed call (connects, and starts the broker and node host on first use)."""
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

    def call():
        if allreduce() != 2.0:
            sys.exit("wrong result")

    return call


def ray_train_fit():
    """Ray Train's TorchTrainer as its docs show for 2 GPU workers (gloo here: logical GPUs on CPU)."""
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

    return fit


def warm_calls_and_fits(rounds: int, calls_per_round: int) -> tuple[float, list[float], list[float]]:
    """Warm-up alike: each side's first call is timed apart and discarded (gpusession's starts the
    broker and node host; Ray Train's imports and starts its controller code). Then rounds
    alternate: `calls_per_round` gpusession calls, one fit()."""
    call, fit = gpusession_call(), ray_train_fit()
    first = timed(call, 1)[0]
    fit()
    calls, fits = [], []
    for _ in range(rounds):
        calls += timed(call, calls_per_round)
        fits += timed(fit, 1)
    return first, calls, fits


_FIRST_CALL = """
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
    interpreter start, import, connect, lease, start ranks, result. Timed from outside as a whole
    subprocess, exactly as torchrun is."""
    import subprocess

    import ray

    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    command = [sys.executable, "-c", _FIRST_CALL]
    return timed(lambda: subprocess.run(command, env=env, capture_output=True, check=True, timeout=300), 1)[0]


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
    parser.add_argument("--rounds", type=int, default=3, help="rounds of warm calls alternated with one fit()")
    parser.add_argument("--calls", type=int, default=5, help="warm @gs.distributed calls per round")
    parser.add_argument("--cold", type=int, default=3, help="first calls of new processes, and torchrun runs")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with local_cluster():
        cluster_first, gs_times, rt_times = warm_calls_and_fits(args.rounds, args.calls)
        first_times, torchrun_times = first_calls_and_torchrun(args.cold)
    print(f"machine load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores (at the start: {load_before[0]:.1f})")
    print(f"first call on a fresh cluster (starts the broker and the node host; discarded): {cluster_first:.2f} s")
    print(f"@gs.distributed(gpus=2), warm: {spread(gs_times)} s")
    print(f"TorchTrainer.fit(), 2 workers, after one discarded fit(): {spread(rt_times)} s")
    print(f"first call of a new process, whole subprocess: {spread(first_times)} s")
    print(f"torchrun cold, whole subprocess, alternating with those: {spread(torchrun_times)} s")
    rows = [
        Row("warm call: call-to-result of a 2-rank allreduce on a running cluster", "s", gs_times,
            "Ray Train TorchTrainer.fit()", rt_times,
            "both: 2 logical GPUs, gloo, one all_reduce; each side's first call discarded as warm-up; "
            f"{args.calls} gpusession calls then one fit() per round, {args.rounds} rounds; Ray Train as its docs "
            "show (ScalingConfig(num_workers=2, use_gpu=True), TorchConfig(backend='gloo'))", "<= 0.10"),
        Row("first call of a new process (interpreter, import, connect, lease, 2 ranks), whole subprocess", "s",
            first_times, "torchrun --standalone --nproc-per-node=2, cold", torchrun_times,
            "both timed from outside as a whole subprocess, alternated, no warm-up on either side; gpusession "
            "joins the running cluster (its node host already started)", "<= 1.0"),
    ]
    write("call_overhead", rows, loadavg_before=load_before)
    print(f"ratio gpusession/ray_train, warm call: {median(gs_times) / median(rt_times):.4f} (target <= 0.10)")
    print(f"ratio first call of a new process / torchrun cold: {median(first_times) / median(torchrun_times):.2f} "
          "(target <= 1.0)")


if __name__ == "__main__":
    main()
