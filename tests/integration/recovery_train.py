"""A small DDP training loop that checkpoints every step and can kill one of its own ranks once,
for the recovery tests and benchmarks: the same data order whatever the attempt, so a run that
was interrupted and resumed must end with exactly the weights of an uninterrupted one."""
from __future__ import annotations

import os
import signal
import time

import gpusession as gs

STEPS = 12


def train(steps: int = STEPS, kill_rank: int | None = None, kill_at_step: int | None = None,
          marker: str | None = None, step_s: float = 0.0, hold_at_step: int | None = None, ballast_mb: float = 0.0):
    """Returns rank 0's final weights. With kill_rank/kill_at_step/marker: that rank SIGKILLs its
    own process at that step, once (the marker file says it happened and when). With
    hold_at_step/marker: rank 0 writes its node id and the time to the marker at that step, once,
    and every rank then waits there (for the test to take the node away). ballast_mb: every
    checkpoint also carries that many MB of bytes (a state too large for Ray to inline, kept in
    an object store)."""
    import torch

    ctx = gs.context()
    torch.manual_seed(0)
    model = gs.prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    state = gs.load_checkpoint()
    if state is not None:
        gs.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    for step in range(start, steps):
        generator = torch.Generator().manual_seed(1000 * step + ctx.rank)
        x = torch.randn(16, 8, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        gs.report(step=step, loss=loss.item(), attempt=ctx.attempt, at=time.time())
        gs.save_checkpoint({"step": step + 1, "model": gs.unwrap(model).state_dict(), "opt": opt.state_dict(),
                            "ballast": bytes(int(ballast_mb * 2**20))})
        if step_s:
            time.sleep(step_s)
        if step == hold_at_step and marker is not None and not os.path.exists(marker):
            torch.distributed.barrier()  # rank 0 has committed this step's checkpoint
            if ctx.rank == 0:
                with open(marker + ".tmp", "w") as f:
                    f.write(f"{ctx.node_id} {time.time()!r}")
                os.rename(marker + ".tmp", marker)
            time.sleep(120)
        if step == kill_at_step and marker is not None and not os.path.exists(marker):
            torch.distributed.barrier()  # rank 0 has committed this step's checkpoint
            if ctx.rank == kill_rank:
                with open(marker, "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
    return {k: v.clone() for k, v in gs.unwrap(model).state_dict().items()}
