"""A user's script on the head of a simulated cluster (RAY_ADDRESS is set): a 2-rank run spread
over both hosts, one rank on each, so every gradient crosses the shaped link.

    python lossy_link_script.py train SEED STEPS [MARKER]  # RESULT: each rank's final weights, the run's record
    python lossy_link_script.py until_cut MARKER      # RESULT: the error the caller saw once a link was cut

`train` is deterministic for a seed: the same weights on any link that delivers every byte.
`until_cut` runs steps until a host is lost under it (max_failures=0: no restart). With a MARKER,
each rank writes MARKER-rank<r> once the run is in its stride, for the test to cut a link then.
"""
from __future__ import annotations

import json
import sys
import time

import gpusession as gs
from gpusession.observe import events

WIDTH = 128  # 16 K weights: 64 KB of gradients a step, many frames for the link to lose
STEP_PAUSE_S = 0.2  # the run lasts a few heartbeat silences, so a false "host lost" has time to show


def train(seed: int, steps: int, marker: str | None = None):
    import socket

    import torch

    ctx = gs.context()
    torch.manual_seed(seed)
    model = gs.prepare_model(torch.nn.Linear(WIDTH, WIDTH))  # DDP: rank 0's initial weights on both
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(seed * 100 + ctx.rank)  # each rank its own batches
    for step in range(steps):
        x = torch.randn(16, WIDTH, generator=data)
        gs.step((model(x) - x).pow(2).mean(), opt)
        if marker and step == 10:
            with open(f"{marker}-rank{ctx.rank}", "w") as f:
                f.write(socket.gethostname())
        time.sleep(STEP_PAUSE_S)
    return {"rank": ctx.rank, "host": socket.gethostname(),
            "weights": [p.detach().flatten().tolist() for p in gs.unwrap(model).parameters()]}


def steps_until_lost(marker: str):
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    for step in range(1_000_000):
        dist.all_reduce(torch.ones(1))
        if step == 10:
            with open(f"{marker}-rank{ctx.rank}", "w") as f:
                json.dump({"host": socket.gethostname(), "node_id": ctx.node_id}, f)
        time.sleep(0.05)


class Transitions(events.Observer):
    """Every restart or resize line the cell would show: a false "host lost" would be one."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def transition(self, info, line: str) -> None:
        self.lines.append(line)


def main() -> None:
    transitions = Transitions()
    events.set_observer_factory(lambda world_size: transitions)
    mode = sys.argv[1]
    result: dict = {}
    if mode == "train":
        call = gs.distributed(gpus=2, placement="spread", return_all=True, timeout="240s")(train)
        result["ranks"] = call(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])
    else:
        call = gs.distributed(gpus=2, placement="spread", max_failures=0, timeout="240s")(steps_until_lost)
        try:
            call(sys.argv[2])
        except Exception as exc:
            result.update(error_time=time.time(), error_type=type(exc).__name__, error=str(exc))
    info = call.last_run
    result["run"] = {k: getattr(info, k) for k in ("run_s", "restarts", "end_reason", "released")}
    result["transitions"] = transitions.lines
    result["receipt"] = info.receipt()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
