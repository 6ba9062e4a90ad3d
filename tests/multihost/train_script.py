"""A user's script on the head of the simulated cluster (RAY_ADDRESS is set): train across hosts.

    python train_script.py spread|strict_spread [--keep-nccl-ifname VALUE] [--fail-on-rank R]

Prints one line `RESULT {json}`: what every rank saw (host, addresses, interfaces) and trained,
and the call's receipt; with --fail-on-rank, the error the call raised once every rank had
written to its scratch directory and rank R raised (each rank leaves the path of its scratch
directory in $TMPDIR/scratch-of-lease<id>-rank<r> on its host, for the test to look at afterwards).
"""
from __future__ import annotations

import json
import sys

import gpusession as gs
from gpusession.observe import events


def train():
    """One DDP step with a known answer: w starts at 1, rank r's loss is w * (r + 1), so the
    averaged gradient is mean(1..world_size) and every rank ends at 1 - 0.1 * that mean."""
    import os
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    model = gs.prepare_model(torch.nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        gs.unwrap(model).weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([[float(ctx.rank + 1)]])).sum().backward()
    opt.step()
    host = socket.gethostname()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "host": host,
            "host_resolves_to": socket.gethostbyname(host), "node_ip": gs.context().address,
            "master_addr": os.environ["MASTER_ADDR"], "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME"), "gpus_seen": len(ctx.gpu_ids),
            "allreduce": total.item(), "weight": gs.unwrap(model).weight.item()}


def fail_on(failing_rank: int):
    """Every rank writes to its scratch directory; then rank `failing_rank` raises while the
    others wait for it in a collective."""
    import os

    import torch.distributed as dist

    ctx = gs.context()
    with open(os.path.join(ctx.scratch_dir, "work"), "w") as f:
        f.write("a rank's work in progress")
    with open(os.path.join(os.environ["TMPDIR"], f"scratch-of-lease{ctx.lease_id}-rank{ctx.rank}"), "w") as f:
        f.write(ctx.scratch_dir)
    dist.barrier()  # every rank has its scratch directory now
    if ctx.rank == failing_rank:
        raise ValueError(f"planned failure on rank {ctx.rank}")
    dist.barrier()  # never passes: the failing rank does not come


def main() -> None:
    placement = sys.argv[1]
    options = {"gpus": 4, "placement": placement, "return_all": True, "timeout": "240s"}
    if placement == "strict_spread":
        options["gpus_per_worker"] = 2
    if "--keep-nccl-ifname" in sys.argv:
        value = sys.argv[sys.argv.index("--keep-nccl-ifname") + 1]
        options["runtime_env"] = {"env_vars": {"NCCL_SOCKET_IFNAME": value}}
    events.set_observer_factory(lambda world_size: events.Observer())
    import ray

    if "--fail-on-rank" in sys.argv:
        call = gs.distributed(**options)(fail_on)
        try:
            call(int(sys.argv[sys.argv.index("--fail-on-rank") + 1]))
        except Exception as exc:
            print("RESULT " + json.dumps({"error_type": type(exc).__name__, "error": str(exc),
                                          "lease_id": call.last_run.lease_id,
                                          "free_gpus_after": ray.available_resources().get("GPU", 0.0)}), flush=True)
        return
    call = gs.distributed(**options)(train)
    ranks = call()
    print("RESULT " + json.dumps({"ranks": ranks, "free_gpus_after": ray.available_resources().get("GPU", 0.0),
                                  "receipt": call.last_run.receipt()}), flush=True)


if __name__ == "__main__":
    main()
