"""A worker killed mid-run -> the next completed training step: gpusession's restart from the
last checkpoint vs two Ray baselines, the same 2-rank DDP loop on the same cluster (gloo, logical
GPUs), measured side by side in one run: Ray Train's FailureConfig(max_failures=1) (a new trainer
per call), and a long-lived pool of actors (benchmarks/_ray_pool.py) as Ray's docs for
fault-tolerant actors show: the dead actor restarted by Ray (max_restarts), the process group
formed again on every rank, the loop called again from its last checkpoint.

    .venv/bin/python benchmarks/recovery.py [--repeat 6]

Both loops checkpoint every step (gpusession: gs.save_checkpoint into the caller's object store;
Ray Train: ray.train.report with a Checkpoint directory) and rank 1 SIGKILLs its own process
after step 5. Measured from the kill (a timestamp the dying rank writes) to the end of the first
step of the new attempt. Samples alternate (gpusession, the pool, Ray Train, ...). Warm-up alike: before
each sample, each side runs the same loop once without a kill (gpusession's workers and warm
parents started, as in a working session; Ray Train's driver-side imports and its storage). Writes benchmarks/results/recovery.json.
Target: gpusession <= 5 s here, ratio <= 0.3.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import in_turn, local_cluster, median  # noqa: E402
from _ray_pool import RayPool  # noqa: E402
from _results import Row, spread, write  # noqa: E402

STEPS, KILL_AT, STEP_S = 10, 5, 0.05


def _step(model, opt, step: int, rank: int):
    import torch

    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=generator)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(STEP_S)


def _die_once(marker: str, step: int, rank: int) -> None:
    if step == KILL_AT and rank == 1 and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def gpusession_recovery_s(marker: str) -> tuple[float, float]:
    """(kill -> restart decided, kill -> first step of the new attempt done)"""
    import torch

    import gpusession as gs
    from gpusession.observe import events

    transitions: list[float] = []

    class Clock(events.Observer):
        def transition(self, info, line):
            transitions.append(time.time())

    events.set_observer_factory(lambda world_size: Clock())

    @gs.distributed(gpus=2)
    def train(marker):
        ctx = gs.context()
        torch.manual_seed(0)
        model = gs.prepare_model(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        state = gs.load_checkpoint() or {"step": 0}
        if "model" in state:
            gs.unwrap(model).load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        for step in range(state["step"], STEPS):
            _step(model, opt, step, ctx.rank)
            gs.report(step=step, at=time.time(), attempt=ctx.attempt)
            gs.save_checkpoint({"step": step + 1, "model": gs.unwrap(model).state_dict(), "opt": opt.state_dict()})
            _die_once(marker, step, ctx.rank)

    open(marker + ".warmup", "w").close()  # an existing marker: the warm-up call kills nobody
    train(marker + ".warmup")  # warm: workers and parents started, as in a working session
    train(marker)
    killed = float(open(marker).read())
    after = [r["at"] for r in train.last_run.history if r["attempt"] == 1]
    return transitions[-1] - killed, after[0] - killed


def ray_train_recovery_s(marker: str) -> float:
    from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    steps_log = marker + ".steps"

    def train_loop(config):
        import json
        import tempfile as tf

        import ray.train
        import torch

        rank = ray.train.get_context().get_world_rank()
        torch.manual_seed(0)
        # logical GPUs: the model stays on the CPU (prepare_model would move it to CUDA)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        start = 0
        checkpoint = ray.train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"))
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"]
        for step in range(start, STEPS):
            _step(model, opt, step, rank)
            with tf.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save({"step": step + 1, "model": model.module.state_dict(), "opt": opt.state_dict()},
                               os.path.join(d, "state.pt"))
                ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
            if rank == 0:
                with open(config["log"], "a") as f:
                    f.write(json.dumps({"step": step, "at": time.time()}) + "\n")
            _die_once(config["marker"], step, rank)

    def trainer(marker: str, steps_log: str) -> TorchTrainer:
        return TorchTrainer(
            train_loop, train_loop_config={"marker": marker, "log": steps_log},
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0}),
            run_config=RunConfig(storage_path=marker + ".storage",  # in the benchmark's folder, removed with it
                                 failure_config=FailureConfig(max_failures=1)),
        )

    open(marker + ".warmup", "w").close()  # an existing marker: the warm-up fit kills nobody
    trainer(marker + ".warmup", marker + ".warmup.steps").fit()
    trainer(marker, steps_log).fit()
    import json

    killed = float(open(marker).read())
    # the first step after the checkpointed one: only the new attempt can finish it (it needs rank 1)
    done = [entry["at"] for entry in map(json.loads, open(steps_log)) if entry["step"] > KILL_AT]
    return min(done) - killed


def _pool_loop(rank: int, world_size: int, marker: str, checkpoint: str, steps_log: str) -> None:
    """The same DDP loop on a pool rank; rank 0 checkpoints to a file after every step."""
    import json

    import torch

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    for step in range(start, STEPS):
        _step(model, opt, step, rank)
        if rank == 0:
            torch.save({"step": step + 1, "model": model.module.state_dict(), "opt": opt.state_dict()},
                       checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
            with open(steps_log, "a") as f:
                f.write(json.dumps({"step": step, "at": time.time()}) + "\n")
        _die_once(marker, step, rank)


def ray_pool_recovery_s(pool: RayPool, marker: str) -> float:
    """The pool's loop with a kill: the call fails, the pool waits for Ray's restart of the dead
    actor and forms the group again, and the loop is called again from its checkpoint."""
    import json

    import ray

    open(marker + ".warmup", "w").close()  # the warm-up loop kills nobody
    pool.run(_pool_loop, marker + ".warmup", marker + ".warmup.ckpt", marker + ".warmup.steps")
    try:
        pool.run(_pool_loop, marker, marker + ".ckpt", marker + ".steps")
        raise SystemExit("the pool's loop was not interrupted by the kill")
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
        pool.recover()
    pool.run(_pool_loop, marker, marker + ".ckpt", marker + ".steps")
    killed = float(open(marker).read())
    done = [entry["at"] for entry in map(json.loads, open(marker + ".steps")) if entry["step"] > KILL_AT]
    return min(done) - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=6,
                        help="kills to time on each side, alternated (the first flipped each time)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix="gpusession-recovery-")
    gs_runs, pool_runs, rt_runs = [], [], []
    with local_cluster(gpus=6):  # the pool holds 2 all along; the others take 2 while they run
        pool = RayPool(2)
        try:
            for i in range(args.repeat):
                in_turn(i, lambda: gs_runs.append(gpusession_recovery_s(os.path.join(work, f"gs-{i}"))),
                        lambda: pool_runs.append(ray_pool_recovery_s(pool, os.path.join(work, f"pool-{i}"))),
                        lambda: rt_runs.append(ray_train_recovery_s(os.path.join(work, f"rt-{i}"))))
        finally:
            pool.shutdown()
            shutil.rmtree(work, ignore_errors=True)  # every side's checkpoints, logs and Ray Train's records
    steps = [s for _, s in gs_runs]
    print(f"gpusession: kill -> restart decided {spread([d for d, _ in gs_runs])} s; kill -> next step done "
          f"{spread(steps)} s")
    print(f"long-lived Ray pool, actor restarted and group formed again: kill -> next step done {spread(pool_runs)} s")
    print(f"Ray Train FailureConfig(max_failures=1): kill -> next step done {spread(rt_runs)} s")
    configured = ("all: the same 2-rank DDP loop on one local cluster (gloo, logical GPUs), a checkpoint every "
                  "step (gpusession: gs.save_checkpoint; pool: rank 0 writes a file; Ray Train: ray.train.report "
                  "with a Checkpoint directory); gpusession max_failures default 3; samples alternated (the first "
                  "flipped each time), before "
                  "each sample one run of the same loop without a kill on each side")
    write("recovery", [
        Row("a rank SIGKILLed mid-run -> the next completed step", "s", steps,
            "long-lived pool: holds its GPUs between calls", pool_runs,
            f"{configured}; pool: 2 Ray actors with max_restarts=-1, the failed call caught, Ray's restart "
            "awaited, the process group formed again on both ranks, the loop called again from its checkpoint"),
        Row("a rank SIGKILLed mid-run -> the next completed step", "s", steps,
            "Ray Train TorchTrainer: a new trainer per call", rt_runs,
            f"{configured}; Ray Train FailureConfig(max_failures=1)", "<= 0.3")], loadavg_before=load_before)
    print(f"ratio gpusession/ray_train: {median(steps) / median(rt_runs):.3f} (target <= 0.3)")


if __name__ == "__main__":
    main()
