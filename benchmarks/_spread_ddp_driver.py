"""Run by benchmarks/spread_ddp.py on the head of the simulated cluster (RAY_ADDRESS is set).

    python _spread_ddp_driver.py SAMPLES

The same small DDP function (issue 23, item 5: gs.prepare_model(Linear(4, 1)), 5 steps, an
all_reduce and an all_gather; no Ray inside) as a 4-rank call spread over 2 hosts and packed on
one; one warm-up call each, then SAMPLES calls each, alternated (the first flipped each time).
Each call's wall-clock and, per rank, where its seconds went (time.time(): every simulated host
shares the machine's clock).
Prints one line `RESULT {json}`.
"""
from __future__ import annotations

import json
import sys
import time

import gpusession as gs
from gpusession.observe import events


def ddp_body() -> dict:
    """The DDP function both spread benchmarks time (this one and _spread_first_driver.py):
    gs.prepare_model(Linear(4, 1)), 5 steps, an all_reduce and an all_gather, no Ray inside.
    Returns the rank, its host and the absolute times (time.time()) at which it entered, wrapped
    the model, stepped and returned; each benchmark derives its own spans from them."""
    import socket

    import torch
    import torch.distributed as dist

    entered = time.time()
    ctx = gs.context()
    model = gs.prepare_model(torch.nn.Linear(4, 1))
    wrapped = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        gs.step(model(torch.randn(8, 4)).pow(2).mean(), opt)
    stepped = time.time()
    total = torch.ones(1)
    dist.all_reduce(total)
    gathered = [torch.zeros(1) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, torch.ones(1))
    return {"rank": ctx.rank, "host": socket.gethostname(), "entered": entered, "wrapped": wrapped,
            "stepped": stepped, "returned": time.time(), "sum": total.item()}


def ddp_function(called_at: float) -> dict:
    r = ddp_body()
    return {"rank": r["rank"], "host": r["host"], "to_function_s": r["entered"] - called_at,
            "prepare_model_s": r["wrapped"] - r["entered"], "steps_s": r["stepped"] - r["wrapped"],
            "collectives_s": r["returned"] - r["stepped"], "returned_at": r["returned"]}


def one_call(call) -> dict:
    started = time.time()
    ranks = call(started)
    ended = time.time()
    info = call.last_run
    return {"wall_s": ended - started, "setup_s": info.setup_s, "run_s": info.run_s,
            "after_last_rank_s": ended - max(r["returned_at"] for r in ranks),
            "hosts": sorted({r["host"] for r in ranks}), "ranks": ranks}


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())
    samples = int(sys.argv[1])
    calls = {placement: gs.distributed(gpus=4, placement=placement, return_all=True, timeout="600s")(ddp_function)
             for placement in ("spread", "pack")}
    result: dict = {"first": {}, "samples": {placement: [] for placement in calls}}
    for placement, call in calls.items():  # the first call of each: nodes' warm parents, workers
        result["first"][placement] = one_call(call)
    for sample in range(samples):  # which placement goes first flips each sample
        for placement, call in list(calls.items())[::1 if sample % 2 == 0 else -1]:
            result["samples"][placement].append(one_call(call))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
