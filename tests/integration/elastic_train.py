"""A DDP loop whose result does not depend on the world size, for the elastic tests and benchmark.

Every step trains on the same global batch of GLOBAL_BATCH samples (seeded by the step),
sharded over the ranks by gs.prepare_loader's DistributedSampler, with DDP averaging the
gradients: so whatever sizes the run goes through, it ends with the weights of plain
full-batch training (`expected_weights`), provided no step was lost or done twice.
"""
from __future__ import annotations

import os
import time

import gpusession as gs

GLOBAL_BATCH = 8  # divisible by every world size the tests use (1, 2, 4)
FEATURES = 4


def batch(step: int):
    import torch

    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def train(stop_file: str, max_steps: int = 10_000, step_s: float = 0.05):
    """Checkpoints every step; stops after the step during which `stop_file` appeared."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    ctx = gs.context()
    torch.manual_seed(0)
    model = gs.prepare_model(torch.nn.Linear(FEATURES, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = gs.load_checkpoint() or {"step": 0}
    if "model" in state:
        gs.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    step = state["step"]
    while step < max_steps:
        stop = os.path.exists(stop_file)  # read before the step: every rank sees the same answer
        loader = gs.prepare_loader(DataLoader(TensorDataset(*batch(step)), batch_size=GLOBAL_BATCH))
        (x, y), = list(loader)  # this rank's shard of the step's global batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        gs.report(step=step, world_size=ctx.world_size, shard=len(x), attempt=ctx.attempt,
                  loss=loss.item(), at=time.time())
        step += 1
        gs.save_checkpoint({"step": step, "model": gs.unwrap(model).state_dict(), "opt": opt.state_dict()})
        flags = torch.tensor([float(stop)])
        torch.distributed.all_reduce(flags)  # stop together, even if the file appeared mid-step
        if flags.item() > 0:
            break
        time.sleep(step_s)
    return {"steps": step, "weights": {k: v.clone() for k, v in gs.unwrap(model).state_dict().items()}}


def expected_weights(steps: int) -> dict:
    """The weights of plain full-batch training for `steps` steps, in this process."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()
