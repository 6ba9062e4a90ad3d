"""One GPU scenario in a fresh process on the embedded default cluster (its own Ray head with this
machine's real GPUs), run by tests/gpu/test_gpu.py: `python gpu_script.py SCENARIO`. Prints one
JSON line "RESULT {...}". The parent never touches CUDA, so the memory it reports is the ranks'."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import gpusession as gs

MEMORY_WAIT_S = 5.0  # a rank exits before its call returns (SPEC); 5 s covers a loaded driver's bookkeeping


def gpu_processes() -> dict[int, int] | None:
    """pid -> bytes of GPU memory, over every GPU of this machine (NVML, no CUDA context); None
    where NVML cannot start (no driver: the scenario's logic still runs, on logical GPUs)."""
    import ray._private.thirdparty.pynvml as nvml

    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        held: dict[int, int] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index)):
                held[proc.pid] = held.get(proc.pid, 0) + int(proc.usedGpuMemory or 0)
        return held
    finally:
        nvml.nvmlShutdown()


def allreduce(gpus: int) -> dict:
    @gs.distributed(gpus=gpus)
    def step():
        import torch
        import torch.distributed as dist

        ctx = gs.context()
        value = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
        dist.all_reduce(value)
        return {"backend": dist.get_backend(), "device": value.device.type, "sum": value.item(),
                "visible": os.environ["CUDA_VISIBLE_DEVICES"], "torch_sees": torch.cuda.device_count()}

    return step()


def two_leases() -> dict:
    def seen():
        import torch

        return {"visible": os.environ["CUDA_VISIBLE_DEVICES"], "torch_sees": torch.cuda.device_count(),
                "uuid": str(torch.cuda.get_device_properties(0).uuid)}

    with gs.lease(gpus=1) as first, gs.lease(gpus=1) as second:
        return {"leases": [{"slots": sorted(g for s in lease.slots for g in s.gpu_ids), **lease.run(seen)}
                           for lease in (first, second)]}


def hold_memory(seconds: float):
    import torch

    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=gs.context().device)  # 256 MiB
    block.fill_(1)
    time.sleep(seconds)
    return int(block.sum().item() > 0)


def ending(kind: str) -> dict:
    """Run a rank that holds 256 MiB of GPU memory and end the call as `kind`; then report every
    process still holding GPU memory that did not before."""
    before = gpu_processes()
    outcome = "returned"
    try:
        if kind == "finished":
            gs.distributed(gpus=1)(hold_memory)(0.5)
        elif kind == "user_error":
            gs.distributed(gpus=1)(lambda: hold_memory(0.5) / 0)()
        elif kind == "timeout":
            gs.distributed(gpus=1, timeout=8)(hold_memory)(600)
        elif kind == "rank_killed":
            gs.distributed(gpus=1, max_failures=0)(lambda: hold_memory(1) and os.kill(os.getpid(), signal.SIGKILL))()
        elif kind == "interrupt":
            signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
            signal.alarm(8)
            gs.distributed(gpus=1)(hold_memory)(600)
        elif kind == "revoked":
            from gpusession.broker import client

            with gs.lease(gpus=1) as lease:
                threading.Timer(8, lambda: client.call(client.broker().revoke, lease.lease_id,
                                                       client.lease_auth())).start()
                lease.run(hold_memory, 600)
        else:
            raise SystemExit(f"unknown ending {kind!r}")
    except BaseException as exc:  # noqa: BLE001 - the ending is what the test looks at
        outcome = type(exc).__name__
    returned_at = time.monotonic()
    while True:
        left = {pid: used for pid, used in (gpu_processes() or {}).items() if pid not in (before or {}) and used > 0}
        if not left or time.monotonic() - returned_at > MEMORY_WAIT_S:
            break
        time.sleep(0.1)
    return {"outcome": outcome, "left": left, "after_s": round(time.monotonic() - returned_at, 2),
            "nvml": before is not None}


if __name__ == "__main__":
    scenario, *rest = sys.argv[1:]
    if scenario == "allreduce":
        result = allreduce(int(rest[0]))
    elif scenario == "two_leases":
        result = two_leases()
    else:
        result = ending(rest[0])
    print("RESULT " + json.dumps(result), flush=True)
