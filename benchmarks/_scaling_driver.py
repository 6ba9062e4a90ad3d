"""Run by benchmarks/scaling.py on the head of the simulated cluster (RAY_ADDRESS is set): the
same `train` function torchrun runs (benchmarks/_scaling_train.py), as an @gs.distributed call.

    python _scaling_driver.py        # then one JSON request a line on stdin

Each request {"gpus": 1|2, "placement": "pack"|"spread", "model": ..., "compression": ...,
"steps": ..., "warmup": ...} is answered by one line `RESULT {json}`: rank 0's figures, the
hosts the ranks ran on and the call's wall-clock; a failed call by `FAILED {json}`. The driver
lives for the whole benchmark, so its calls find the nodes' workers started, as a notebook's do.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _scaling_train  # noqa: E402

import gpusession as gs  # noqa: E402
from gpusession.observe import events  # noqa: E402


def train_on_rank(model: str, compression: str, steps: int, warmup: int) -> dict:
    return {**_scaling_train.train(model, compression, steps, warmup), "host": socket.gethostname()}


def answer(calls: dict, request: dict) -> dict:
    key = (request["gpus"], request["placement"])
    if key not in calls:
        calls[key] = gs.distributed(gpus=key[0], placement=key[1], return_all=True, timeout="600s")(train_on_rank)
    started = time.time()
    ranks = calls[key](request["model"], request["compression"], request["steps"], request["warmup"])
    rank0 = next(r for r in ranks if r["rank"] == 0)
    return {**rank0, "hosts": sorted({r["host"] for r in ranks}), "wall_s": time.time() - started}


def main() -> None:
    events.set_observer_factory(lambda world_size: events.Observer())  # no cell to draw on
    calls: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            print("RESULT " + json.dumps(answer(calls, request)), flush=True)
        except Exception as exc:  # the benchmark stops on it and shows this
            print("FAILED " + json.dumps({"error_type": type(exc).__name__, "error": str(exc)[:3000]}), flush=True)


if __name__ == "__main__":
    main()
