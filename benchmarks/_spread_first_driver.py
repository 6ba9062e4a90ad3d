"""Run by benchmarks/spread_first.py on the head of the simulated cluster (RAY_ADDRESS is set), as a
new process for every sample: a user's script whose first gpusession call is a 4-rank DDP call
spread over 2 hosts (issue 23, item 5: gs.prepare_model(Linear(4, 1)), 5 steps, an all_reduce and
an all_gather; no Ray inside), then exits.

    python _spread_first_driver.py

Prints one line `RESULT {json}`: when the imports ended, the call's span, its receipt's queued /
setup / run seconds, and per rank the absolute times (time.time(): every simulated host shares
the machine's clock) at which it entered the function, wrapped the model, stepped and returned.
"""
from __future__ import annotations

import time

STARTED = time.time()  # before any import

import json  # noqa: E402

import gpusession as gs  # noqa: E402
from gpusession import events  # noqa: E402

IMPORTED = time.time()


def ddp_function() -> dict:
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


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())  # no cell to draw on
    call = gs.distributed(gpus=4, placement="spread", return_all=True, timeout="600s")(ddp_function)
    called = time.time()
    ranks = call()
    returned = time.time()
    info = call.last_run
    print("RESULT " + json.dumps({"started": STARTED, "imported": IMPORTED, "called": called, "returned": returned,
                                  "queued_s": info.queued_s, "setup_s": info.setup_s, "run_s": info.run_s,
                                  "hosts": sorted({r["host"] for r in ranks}), "ranks": ranks}), flush=True)


if __name__ == "__main__":
    main()
