"""Framework probes run inside a rank (by test_frameworks.py, under @gs.distributed) and under
torchrun (`python -m torch.distributed.run ... frameworks_probe.py NAME OUT`): each returns what
the framework believes about the world and whether the replicas agree after one step."""
from __future__ import annotations

import json
import os
import sys


def _in_sync(parameters) -> bool:
    """Every rank holds the same weights: the max over ranks equals the min over ranks."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([p.detach().reshape(-1).float() for p in parameters])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return bool(torch.equal(high, low))


def accelerate_probe() -> dict:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(accelerator.process_index)  # different data and init per rank on purpose
    model, opt = accelerator.prepare(torch.nn.Linear(4, 1), torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    accelerator.backward(model(x).pow(2).mean())
    opt.step()
    return {"processes": accelerator.num_processes, "index": accelerator.process_index,
            "type": str(accelerator.distributed_type), "in_sync": _in_sync(model.parameters())}


def trainer_probe(output_dir: str) -> dict:
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.linear(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(32)]
    args = TrainingArguments(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    model = Tiny()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return {"processes": args.world_size, "index": args.process_index, "type": str(args.parallel_mode),
            "in_sync": _in_sync(model.parameters())}


def lightning_probe(output_dir: str) -> dict:
    import pytorch_lightning as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.linear(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                         num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
                         max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=output_dir)
    model = Tiny()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    return {"processes": trainer.world_size, "index": trainer.global_rank, "type": type(trainer.strategy).__name__,
            "in_sync": _in_sync(model.parameters())}


def run_all(output_dir: str) -> dict:
    """One rank's view through each framework, one after another in the same process group."""
    return {"accelerate": accelerate_probe(), "trainer": trainer_probe(output_dir),
            "lightning": lightning_probe(output_dir)}


if __name__ == "__main__":  # under torchrun: every rank writes what it saw
    import torch.distributed as dist

    dist.init_process_group("gloo")
    seen = run_all(os.path.dirname(sys.argv[1]))
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        json.dump(seen, f)
    # As torch's docs ask of a script: without it, gloo's threads can abort the interpreter's
    # exit (SIGABRT, "terminate called without an active exception"; torchrun then fails the run).
    dist.barrier()
    dist.destroy_process_group()
