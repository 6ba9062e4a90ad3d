"""The embedded default cluster exactly as a user gets it (no RAY_ADDRESS, a fresh GPUSESSION_HOME,
the broker with its default policy), run by test_production_defaults.py. Prints one JSON line
"RESULT {...}": the broker's policy, a 2-GPU run's value, and how long after a revoke the broker
took back a lease whose holder ignored the notice (the default revoke grace)."""
from __future__ import annotations

import json
import time

import gpusession as gs
from gpusession.broker import client


@gs.distributed(gpus=2)
def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(gs.context().rank + 1)])
    dist.all_reduce(value)
    return value.item()


def main() -> dict:
    total = allreduce()  # starts the embedded head and the broker with its defaults
    broker = client.broker()
    policy = client.call(broker.info)["policy"]
    held = gs.lease(gpus=1)  # held, never run: its holder never reacts to a notice
    client.call(broker.revoke, held.lease_id, client.lease_auth())
    revoked = time.monotonic()
    while True:
        view = client.call(broker.wait, held.lease_id, -1, 0.0, auth=client.lease_auth())
        if view["state"] == "ended" or time.monotonic() - revoked > 120:
            break
        time.sleep(0.1)
    taken_back_s = time.monotonic() - revoked
    return {"policy": policy, "sum": total, "end_reason": view["end_reason"], "taken_back_s": round(taken_back_s, 2)}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
