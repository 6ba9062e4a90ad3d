"""The torchrun side of benchmarks/spread_first.py: the same small DDP function as
_spread_first_driver.py's (Linear(4, 1) in DDP, 5 steps, an all_reduce and an all_gather) as a
script, the way a torchrun user writes it (init_process_group from torchrun's environment, the
group destroyed at the end).

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT _spread_first_train.py

Each rank writes SPREAD_FIRST_OUT/rankN.json with the absolute times (time.time()) at which it
started, imported torch, joined the process group, wrapped the model, stepped and finished.
"""
from __future__ import annotations

import time

STARTED = time.time()  # before any import

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IMPORTED = time.time()


def main() -> None:
    dist.init_process_group("gloo")
    joined = time.time()
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    wrapped = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    stepped = time.time()
    total = torch.ones(1)
    dist.all_reduce(total)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.ones(1))
    rank = dist.get_rank()
    dist.destroy_process_group()
    times = {"rank": rank, "host": socket.gethostname(), "started": STARTED, "imported": IMPORTED, "joined": joined,
             "wrapped": wrapped, "stepped": stepped, "returned": time.time(), "sum": total.item()}
    with open(os.path.join(os.environ["SPREAD_FIRST_OUT"], f"rank{rank}.json"), "w") as f:  # ranks share stdout
        json.dump(times, f)


if __name__ == "__main__":
    main()
