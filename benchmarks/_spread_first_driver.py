"""Run by benchmarks/spread_first.py on the head of the simulated cluster (RAY_ADDRESS is set), as a
new process for every sample: a user's script whose first gpusession call is a 4-rank DDP call
spread over 2 hosts (issue 23, item 5: gs.prepare_model(Linear(4, 1)), 5 steps, an all_reduce and
an all_gather; no Ray inside: _spread_ddp_driver.ddp_body, which benchmarks/spread_ddp.py times
too), then exits.

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
from gpusession.observe import events  # noqa: E402
from _spread_ddp_driver import ddp_body  # noqa: E402  (beside this script: shipped to the ranks by value)

IMPORTED = time.time()


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())  # no cell to draw on
    call = gs.distributed(gpus=4, placement="spread", return_all=True, timeout="600s")(ddp_body)
    called = time.time()
    ranks = call()
    returned = time.time()
    info = call.last_run
    print("RESULT " + json.dumps({"started": STARTED, "imported": IMPORTED, "called": called, "returned": returned,
                                  "queued_s": info.queued_s, "setup_s": info.setup_s, "run_s": info.run_s,
                                  "hosts": sorted({r["host"] for r in ranks}), "ranks": ranks}), flush=True)


if __name__ == "__main__":
    main()
