"""A seeded DDP training loop written the torchrun way: it initialises the process group itself
and reads RANK/WORLD_SIZE. Run unmodified by torchrun and by @gs.distributed in the parity tests."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 8, generator=generator)
    y = (x @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(256, generator=generator)).unsqueeze(1)
    return TensorDataset(x, y)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train_torchrun_style(epochs: int = 3) -> dict:
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert dist.get_rank() == rank and dist.get_world_size() == world
    ddp = DistributedDataParallel(model())
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}


def train_with_gpusession_helpers(epochs: int = 3) -> dict:
    import gpusession as gs

    ddp = gs.prepare_model(model())
    loader = gs.prepare_loader(DataLoader(dataset(), batch_size=16, shuffle=True))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in gs.unwrap(ddp).state_dict().items()}


if __name__ == "__main__":  # torchrun --nproc_per_node=2 ddp_train.py OUT.pt
    state = train_torchrun_style()
    if int(os.environ["RANK"]) == 0:
        torch.save(state, sys.argv[1])
    dist.destroy_process_group()
