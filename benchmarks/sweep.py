"""The same hyperparameter search under gs.sweep and under Ray Tune's Tuner, side by side in one
run on one cluster (4 logical GPUs): 16 trials of a small model, 4 in parallel, ASHA.

    .venv/bin/python benchmarks/sweep.py [--trials 16] [--parallel 4] [--epochs 8]

Both sides draw the trials at random from the same space (seeded), prune with ASHA at the same
rungs (grace period 1 epoch, reduction factor 4: Optuna's SuccessiveHalvingPruner and Tune's
ASHAScheduler) and run one trial per GPU. Printed per side: wall-clock of the whole search, and
the fraction of GPU-time spent inside trial functions — of the GPU-time the sweep leased
(gs.sweep: each trial's lease, grant to release) and of the cluster's GPUs over the search
(4 GPUs x wall-clock; Tune holds them for the whole fit). The last line is the wall-clock ratio
(target <= 0.5; busy fraction target >= 0.9). gpusession runs warm, as in a kernel after its first
call (its worker processes already imported torch); Tune starts its trial actors itself.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import CLUSTER_GPUS, local_cluster  # noqa: E402

LR = (1e-3, 0.3)
WIDTHS = [8, 16, 32, 64]
SEED = 0


def fit_epochs(lr: float, width: int, epochs: int, report) -> None:
    """A small MLP on a fixed synthetic regression task; report(epoch, val_loss, inside_s) each epoch."""
    import time as clock

    import torch

    started = clock.perf_counter()
    torch.set_num_threads(1)  # one core per trial on both sides: 4 trials share a small machine
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 16, generator=generator)
    y = (x[:, :4].sum(dim=1, keepdim=True) ** 2) / 4 + 0.1 * torch.randn(2048, 1, generator=generator)
    train_x, train_y, val_x, val_y = x[:1536], y[:1536], x[1536:], y[1536:]
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for epoch in range(epochs):
        for batch in range(0, len(train_x), 64):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(train_x[batch:batch + 64]), train_y[batch:batch + 64])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = torch.nn.functional.mse_loss(model(val_x), val_y).item()
        if val_loss != val_loss or val_loss > 1e6:  # diverged: a large finite value, as both sides see it
            val_loss = 1e6
        report(epoch + 1, val_loss, clock.perf_counter() - started)


def gs_train(lr: float, width: int, epochs: int) -> float:
    import gpusession as gs

    last = {}

    def report(epoch, val_loss, inside_s):
        last["val_loss"] = val_loss
        gs.report(step=epoch, val_loss=val_loss)

    fit_epochs(lr, width, epochs, report)
    return last["val_loss"]


def run_gpusession(trials: int, parallel: int, epochs: int) -> dict:
    import gpusession as gs
    from gpusession import events

    events.set_observer_factory(lambda world_size: events.Observer())

    @gs.distributed(gpus=CLUSTER_GPUS)
    def warm_up():  # as after a kernel's first call: the warm workers have imported torch
        return 0

    warm_up()
    events.set_observer_factory(None)
    started = time.perf_counter()
    result = gs.sweep(gs_train, {"lr": gs.loguniform(*LR), "width": gs.choice(WIDTHS), "epochs": epochs},
                      trials=trials, parallel=parallel, objective="val_loss", mode="min", sampler="random",
                      seed=SEED, pruner="asha", gpus=1)
    wall = time.perf_counter() - started
    inside = sum(t.run_s for t in result.trials)
    leased = sum(t.gpu_seconds for t in result.trials)
    pruned = sum(1 for t in result.trials if t.state.value == "pruned")
    return {"wall": wall, "inside": inside, "leased": leased, "best": result.best.value, "pruned": pruned,
            "trials": len(result.trials)}


def run_ray_tune(trials: int, parallel: int, epochs: int) -> dict:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config):
        fit_epochs(config["lr"], config["width"], epochs,
                   lambda epoch, val_loss, inside_s: tune.report({"val_loss": val_loss, "epoch": epoch,
                                                                  "inside_s": inside_s}))

    scheduler = ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=1, reduction_factor=4)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0, "gpu": 1}),
        param_space={"lr": tune.loguniform(*LR), "width": tune.choice(WIDTHS)},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=scheduler, num_samples=trials,
                                    max_concurrent_trials=parallel,
                                    search_alg=tune.search.BasicVariantGenerator(random_state=SEED)),
        run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="tune-bench-"), verbose=0),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - started
    frames = grid.get_dataframe()
    inside = float(frames["inside_s"].sum())
    pruned = int((frames["epoch"] < epochs).sum())
    best = grid.get_best_result().metrics["val_loss"]
    return {"wall": wall, "inside": inside, "leased": CLUSTER_GPUS * wall, "best": best, "pruned": pruned,
            "trials": len(frames)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    with local_cluster():
        ours = run_gpusession(args.trials, args.parallel, args.epochs)
        tune_ = run_ray_tune(args.trials, args.parallel, args.epochs)
    for name, side in (("gs.sweep", ours), ("Ray Tune Tuner", tune_)):
        print(f"{name}: {side['trials']} trials ({side['pruned']} stopped early), wall-clock {side['wall']:.1f} s, "
              f"best val_loss {side['best']:.4f}, inside trials {side['inside']:.1f} GPU·s")
    print(f"gs.sweep busy fraction of leased GPU-time: {ours['inside'] / ours['leased']:.2f} "
          f"({ours['inside']:.1f} of {ours['leased']:.1f} GPU·s; target >= 0.9)")
    print(f"busy fraction of the cluster's GPUs over the search: gs.sweep "
          f"{ours['inside'] / (CLUSTER_GPUS * ours['wall']):.2f}, Ray Tune {tune_['inside'] / tune_['leased']:.2f}")
    print(f"ratio gs.sweep/ray_tune wall-clock: {ours['wall'] / tune_['wall']:.3f} (target <= 0.5)")


if __name__ == "__main__":
    main()
