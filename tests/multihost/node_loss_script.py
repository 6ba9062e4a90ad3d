"""A user's script on the head of the simulated cluster (RAY_ADDRESS is set): a 4-rank run spread
over both hosts that goes on until a host is lost under it (the test kills it or cuts its link).

    python node_loss_script.py MARKER_PREFIX RUNS

Run i (0, 1, ...): every rank writes MARKER_PREFIX-<i>-rank<r> (its host, its scratch
directory) once the run is in its stride; when the run ends the script prints
`RESULT {json}`: the error the caller saw and when (time.time(): every simulated host shares
the machine's clock), what Ray showed free right after, the receipt. Then it waits for the file
MARKER_PREFIX-<i>.go (the test brings the lost host back) before run i + 1. One driver for every
scenario: its warm workers on the surviving host serve the next run.
"""
from __future__ import annotations

import json
import os
import sys
import time

import ray

import gpusession as gs
from gpusession import events
from gpusession.cluster import raycluster


def steps_until_lost(marker_prefix: str):
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    for step in range(1_000_000):
        dist.all_reduce(torch.ones(1))
        if step == 10:
            with open(f"{marker_prefix}-rank{ctx.rank}", "w") as f:
                json.dump({"host": socket.gethostname(), "scratch_dir": ctx.scratch_dir, "lease_id": ctx.lease_id,
                           "node_id": ctx.node_id, "address": ctx.address}, f)
        time.sleep(0.05)


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())
    ray.init()
    prefix, runs = sys.argv[1], int(sys.argv[2])
    for i in range(runs):
        if i:
            while not os.path.exists(f"{prefix}-{i - 1}.go"):
                time.sleep(0.1)
        one_run(f"{prefix}-{i}")


def one_run(prefix: str) -> None:
    call = gs.distributed(gpus=4, placement="spread", timeout="240s")(steps_until_lost)
    result: dict = {}
    started = time.time()
    try:
        call(prefix)
    except BaseException as exc:
        result["error_time"] = time.time()
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)
        result["rank"] = getattr(exc, "rank", None)
    free = raycluster.available_gpus_by_node()
    result["free_after"] = {}  # per address: a host started again may briefly show its old node too
    for node in raycluster.nodes():
        result["free_after"][node.address] = max(result["free_after"].get(node.address, 0.0),
                                                 free.get(node.node_id, 0.0))
    info = call.last_run
    result["wall_s"] = time.time() - started
    result["run_info"] = {k: getattr(info, k) for k in ("queued_s", "setup_s", "run_s", "gpu_seconds", "end_reason",
                                                       "released", "restarts", "transitions")}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
