"""What PowerSGD costs in accuracy: the loss after the same steps with grad_compression
"powersgd" (rank 2, 10 plain steps), gs.PowerSGD(rank=4, warmup_steps=20) and fp16, against
plain DDP, on two regression tasks, 2 ranks (gloo, logical GPUs), every run seeded alike.

    .venv/bin/python benchmarks/powersgd_loss.py [--steps 120] [--seeds 5]

Tasks: "tanh teacher" (tests/integration/comm_train.py's: 32 inputs, a tanh teacher of rank 4,
an MLP 32-64-1, SGD lr 0.1 momentum 0.9, full batch per rank) and "sum of squares" (16 inputs,
target the squared sum of the first 4 / 4, the sweep benchmark's task, an MLP 16-64-1, SGD lr 0.1
momentum 0.9). Each sample is a seed of the data and the model; each side runs the same seeds.
A row's figure is the loss on all the data after --steps steps; its ratio is compressed / plain
(lower is better; 1 is no loss of accuracy). Writes benchmarks/results/powersgd_loss.json.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster  # noqa: E402
from _results import Row, spread, write  # noqa: E402

TASKS = ("tanh teacher", "sum of squares")


def data(task: str, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    if task == "tanh teacher":
        x = torch.randn(4096, 32, generator=generator)
        teacher = torch.randn(32, 4, generator=generator) / 4
        return x, torch.tanh(x @ teacher) @ torch.ones(4, 1) + 0.1 * torch.randn(4096, 1, generator=generator)
    x = torch.randn(4096, 16, generator=generator)
    return x, (x[:, :4].sum(dim=1, keepdim=True) ** 2) / 4 + 0.1 * torch.randn(4096, 1, generator=generator)


def train(task: str, seed: int, steps: int) -> float:
    """On each rank: its half of the data, full batch; the loss on all the data at the end."""
    import torch

    import gpusession as gs

    ctx = gs.context()
    x, y = data(task, seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    ddp = gs.prepare_model(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    shard = slice(ctx.rank, None, ctx.world_size)
    for _ in range(steps):
        gs.step(torch.nn.functional.mse_loss(ddp(x[shard]).float(), y[shard]), optimizer)
    with torch.no_grad():
        return torch.nn.functional.mse_loss(gs.unwrap(ddp)(x), y).item()


def settings():
    import gpusession as gs

    return {"powersgd (rank 2, 10 plain steps)": "powersgd",
            "PowerSGD(rank=4, warmup_steps=20)": gs.PowerSGD(rank=4, warmup_steps=20), "fp16": "fp16"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=5, help="seeds of data and model, each a sample on every side")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a smoke run that must not replace the measured file)")
    args = parser.parse_args()
    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    load_before = os.getloadavg()
    rows = []
    with local_cluster():
        plain_call = gs.distributed(gpus=2)(train)
        for task in TASKS:
            plain = [plain_call(task, seed, args.steps) for seed in range(args.seeds)]
            for name, option in settings().items():
                call = gs.distributed(gpus=2, grad_compression=option)(train)
                losses = [call(task, seed, args.steps) for seed in range(args.seeds)]
                print(f"{task}, {name}: loss {spread(losses)} vs plain {spread(plain)}", flush=True)
                rows.append(Row(f"{task}: loss after {args.steps} steps, grad_compression={name}", "", losses,
                                "plain DDP (fp32 all-reduce), the same steps and seeds", plain,
                                f"2 ranks, gloo, logical GPUs; full batch per rank; seeds 0-{args.seeds - 1}, each "
                                "a sample on every side; the ratio is compressed / plain loss (1: no loss of "
                                "accuracy)"))
    path = write("powersgd_loss", rows, loadavg_before=load_before, folder=Path(args.out) if args.out else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
