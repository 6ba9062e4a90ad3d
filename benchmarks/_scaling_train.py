"""The DDP script benchmarks/scaling.py runs under torchrun (one launcher per host) and, the same
`train` function, in the ranks of an @gs.distributed call (benchmarks/_scaling_driver.py): a seeded
regression on a model where the link matters (link: three 1024x1024 layers, 12.6 MB of fp32
gradients a step) or does not (compute: batches of 2048 through sixteen 64-wide layers, 0.27 MB of
gradients), with the communication option gpusession would apply (its own hook, run/comm_hooks).

    torchrun ... benchmarks/_scaling_train.py MODEL COMPRESSION STEPS WARMUP
prints, on rank 0, `RESULT {"samples_per_s": ..., "loss": ..., "bytes_per_step": ...}`.
One compute thread per rank on both launchers (torchrun's default for several ranks per host;
set here so a gpusession rank, whose thread count Ray would choose, runs alike).
"""
from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpusession.run.comm_options import validate_comm_options  # noqa: E402
from gpusession.run.rank import comm_hooks  # noqa: E402

BATCH = {"link": 64, "compute": 2048}  # per rank
WIDTH = {"link": 1024, "compute": 64}


def model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    width = WIDTH[kind]
    depth = 3 if kind == "link" else 16  # compute: a deep narrow stack, much arithmetic, few parameters
    inner = [layer for _ in range(depth) for layer in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    return torch.nn.Sequential(*inner, torch.nn.Linear(width, 1))


def rank_device() -> torch.device:
    """This rank's GPU where there is one (nccl: benchmarks/gpu_check.py), else the CPU (gloo)."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def settle(device: torch.device) -> None:
    """Wait for the GPU's queued work before reading the clock (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch(kind: str, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH[kind], WIDTH[kind], generator=generator)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(WIDTH[kind], 1, generator=teacher) / WIDTH[kind] ** 0.5
    return x, torch.tanh(x @ w)


def train(kind: str, compression: str, steps: int, warmup: int) -> dict:
    """The whole script: its own init_process_group (under gpusession it lands on the rank's
    group), WARMUP untimed steps, STEPS timed between barriers; every rank returns the figures."""
    torch.set_num_threads(1)
    device = rank_device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(model(kind).to(device), device_ids=[device] if device.type == "cuda" else None)
    comm = comm_hooks.RankComm(validate_comm_options(grad_compression=None if compression == "none" else compression))
    if compression != "none":
        comm_hooks.apply_to_model(ddp, comm, device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2)
    started = cpu_main = cpu_process = None
    for step in range(warmup + steps):
        if step == warmup:
            settle(device)
            dist.barrier()
            started, cpu_main, cpu_process = time.perf_counter(), time.thread_time(), time.process_time()
            usage = resource.getrusage(resource.RUSAGE_THREAD)
        x, y = (tensor.to(device) for tensor in batch(kind, step, rank))
        comm_hooks.step(torch.nn.functional.mse_loss(ddp(x), y), optimizer, comm)
    settle(device)
    dist.barrier()
    took = time.perf_counter() - started
    # CPU seconds over the timed steps: this thread's (the model's arithmetic) and the whole
    # process's (with gloo's and any launcher's threads). Against `took`, they tell a rank that
    # waited for the CPU (less of it per second) from one that had more to do.
    cpu_main, cpu_process = time.thread_time() - cpu_main, time.process_time() - cpu_process
    # The main thread's page faults and context switches over the timed steps: a rank whose
    # steps fault in fresh pages, or get switched out, does less per second of CPU.
    after = resource.getrusage(resource.RUSAGE_THREAD)
    faults = {"minor_faults": after.ru_minflt - usage.ru_minflt, "major_faults": after.ru_majflt - usage.ru_majflt,
              "voluntary_switches": after.ru_nvcsw - usage.ru_nvcsw,
              "involuntary_switches": after.ru_nivcsw - usage.ru_nivcsw, "system_s": after.ru_stime - usage.ru_stime}
    x, y = (tensor.to(device) for tensor in batch(kind, 10**6, 0))
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(ddp.module(x), y).item()
    dist.destroy_process_group()
    return {"rank": rank, "samples_per_s": steps * BATCH[kind] * world / took, "loss": loss,
            "bytes_per_step": comm.counted.last, "seconds": took,
            "fp32_grad_bytes": sum(4 * p.numel() for p in ddp.parameters()),
            "niceness": os.nice(0),  # the launcher's: Ray starts its workers at 15 by default
            "cpu_main_s": cpu_main, "cpu_process_s": cpu_process, "threads": threading.active_count(),
            "os_threads": len(os.listdir("/proc/self/task")), "torch_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpus_allowed": len(os.sched_getaffinity(0)), "autogroup": _autogroup(), **faults}


def _autogroup() -> str:
    """The scheduler group the rank shares CPU time in (Linux autogroup: one per session)."""
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return "none"


if __name__ == "__main__":
    result = train(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    if result["rank"] == 0:
        print("RESULT " + json.dumps(result), flush=True)
