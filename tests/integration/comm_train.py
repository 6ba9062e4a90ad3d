"""A small seeded regression trained with gs.prepare_model and gs.step, for the communication
options' tests: its loss on the whole data set is the figure each option is compared by."""
from __future__ import annotations

import torch

NOISE = 0.1  # the target's noise: the lowest mean squared error any model reaches is NOISE ** 2


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 32, generator=generator)
    teacher = torch.randn(32, 4, generator=generator) / 4
    y = torch.tanh(x @ teacher) @ torch.ones(4, 1) + NOISE * torch.randn(4096, 1, generator=generator)
    return x, y


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def train(steps: int = 120) -> dict:
    """Full-batch-per-rank training (each rank its half of the data); returns the final loss on
    all the data, in fp32, and the model's parameter bytes."""
    import gpusession as gs

    ctx = gs.context()
    x, y = data()
    shard = slice(ctx.rank, None, ctx.world_size)
    ddp = gs.prepare_model(model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(ddp(x[shard]).float(), y[shard])
        gs.step(loss, optimizer)
    plain = gs.unwrap(ddp)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(plain(x), y).item()
    return {"loss": final, "param_bytes": sum(p.numel() * 4 for p in plain.parameters())}
