"""The DDP loop both launchers run: same model, data, steps and backend. Run by torchrun as a
script, and imported by ddp_step_overhead.py for @gs.distributed."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

WARMUP_STEPS = 20


def step_times(steps: int = 200, width: int = 512) -> list[float]:
    """Seconds per optimizer step on this rank, after warm-up (setup excluded)."""
    torch.set_num_threads(1)  # the two launchers' ranks share 2 cores: same threads on both sides
    dist.init_process_group("gloo")  # as a torchrun script does; under gpusession it finds the group ready
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))
    durations = []
    for step in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()  # backward all-reduces gradients
        optimizer.step()
        if step >= WARMUP_STEPS:
            durations.append(time.perf_counter() - started)
    return durations


def median_step(durations: list[float]) -> float:
    return statistics.median(durations)


if __name__ == "__main__":  # torchrun --nproc_per_node=2 ddp_loop.py OUT.json STEPS
    times = step_times(int(sys.argv[2]))
    if int(os.environ["RANK"]) == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()
