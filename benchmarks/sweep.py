"""The same hyperparameter search under gs.sweep and under Ray Tune's Tuner, side by side in one
run on one cluster (4 logical GPUs): 16 trials of a small model, 4 in parallel, ASHA.

    .venv/bin/python benchmarks/sweep.py [--trials 16] [--parallel 4] [--epochs 8] [--samples 6] [--unpruned]

Both sides run the same configurations: `trials` (lr, width) pairs drawn once (seeded) and given
to each side as a grid over their index (gs.sweep sampler="grid"; Tune tune.grid_search). Both
prune with asynchronous successive halving at the same rungs (grace period 1 epoch, reduction
factor 4, one bracket: Optuna's SuccessiveHalvingPruner and Tune's ASHAScheduler, each set
explicitly; the two implementations may still stop different trials, so the trials each side
stopped early are written beside the times) and run one trial per GPU. Since the two prune
different trials, the wall-clock alone compares unequal work: the rows also give each side's
epochs trained per second of wall-clock (the work it did over the time it took), and with
--unpruned neither side prunes, so both run every trial to its last epoch. Warm-up alike: before the
timed searches each side runs one discarded search of `parallel` 1-epoch trials (gpusession's warm
workers import torch; Tune's trial actors start and, with reuse_actors=True as Tune's docs
recommend for many short trials, are reused). Samples alternate, the order flipped each round
(gs.sweep then Tune, then Tune then gs.sweep, ...). Printed per side: wall-clock of the whole search, and
the fraction of GPU-time spent inside trial functions — of the GPU-time the sweep leased
(gs.sweep: each trial's lease, grant to release) and of the cluster's GPUs over the search
(4 GPUs x wall-clock; Tune holds them for the whole fit). The last line is the ratio of epochs
trained per second (target >= 2, the same as half the wall-clock at equal work; with --unpruned the
wall-clock row carries the <= 0.5 target; busy fraction target >= 0.9). Writes
benchmarks/results/sweep.json (sweep-unpruned.json with --unpruned).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import CLUSTER_GPUS, local_cluster  # noqa: E402
from _results import Row, spread, write  # noqa: E402

LR = (1e-3, 0.3)
WIDTHS = [8, 16, 32, 64]
SEED = 0


def configurations(trials: int) -> list[dict]:
    """The (lr, width) pairs both sides run, drawn once: log-uniform lr, uniform width."""
    import math
    import random

    rng = random.Random(SEED)
    return [{"lr": math.exp(rng.uniform(math.log(LR[0]), math.log(LR[1]))), "width": rng.choice(WIDTHS)}
            for _ in range(trials)]


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


def gs_train(index: int, configs: list, epochs: int) -> float:
    import gpusession as gs

    last = {}

    def report(epoch, val_loss, inside_s):
        last["val_loss"] = val_loss
        gs.report(step=epoch, val_loss=val_loss)

    fit_epochs(configs[index]["lr"], configs[index]["width"], epochs, report)
    return last["val_loss"]


def run_gpusession(configs: list, parallel: int, epochs: int, prune: bool = True) -> dict:
    import optuna

    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=4, min_early_stopping_rate=0)
              if prune else None)
    started = time.perf_counter()
    result = gs.sweep(gs_train, {"index": gs.choice(list(range(len(configs)))), "configs": configs, "epochs": epochs},
                      trials=len(configs), parallel=parallel, objective="val_loss", mode="min", sampler="grid",
                      seed=SEED, pruner=pruner, gpus=1)
    wall = time.perf_counter() - started
    events.set_observer_factory(None)
    inside = sum(t.run_s for t in result.trials)
    leased = sum(t.gpu_seconds for t in result.trials)
    pruned = sum(1 for t in result.trials if t.state.value == "pruned")
    epochs_run = sum(t.step or 0 for t in result.trials)  # each trial's last reported epoch
    return {"wall": wall, "inside": inside, "leased": leased, "best": result.best.value, "pruned": pruned,
            "trials": len(result.trials), "epochs": epochs_run}


def run_ray_tune(configs: list, parallel: int, epochs: int, prune: bool = True) -> dict:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config):
        chosen = configs[config["index"]]
        fit_epochs(chosen["lr"], chosen["width"], epochs,
                   lambda epoch, val_loss, inside_s: tune.report({"val_loss": val_loss, "epoch": epoch,
                                                                  "inside_s": inside_s}))

    storage = tempfile.mkdtemp(prefix="tune-bench-")
    scheduler = (ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=1, reduction_factor=4, brackets=1)
                 if prune else None)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0, "gpu": 1}),
        param_space={"index": tune.grid_search(list(range(len(configs))))},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", num_samples=1,
                                    **({"scheduler": scheduler} if scheduler is not None else {}),
                                    max_concurrent_trials=parallel, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    try:
        started = time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - started
        frames = grid.get_dataframe()
        best = grid.get_best_result().metrics["val_loss"]
    finally:
        shutil.rmtree(storage, ignore_errors=True)  # the trials' records, once read
    inside = float(frames["inside_s"].sum())
    pruned = int((frames["epoch"] < epochs).sum())
    return {"wall": wall, "inside": inside, "leased": CLUSTER_GPUS * wall, "best": best, "pruned": pruned,
            "trials": len(frames), "epochs": int(frames["epoch"].sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=6, help="searches timed on each side, alternated")
    parser.add_argument("--unpruned", action="store_true",
                        help="no pruning on either side: every trial runs every epoch (equal work); writes "
                             "results/sweep-unpruned.json")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a smoke run that must not replace the measured file)")
    args = parser.parse_args()
    prune = not args.unpruned
    load_before = os.getloadavg()
    configs = configurations(args.trials)
    ours, tune_ = [], []
    with local_cluster():
        run_gpusession(configs[:args.parallel], args.parallel, 1)  # warm-up alike, discarded
        run_ray_tune(configs[:args.parallel], args.parallel, 1)
        for sample in range(args.samples):
            sides = [(ours, run_gpusession), (tune_, run_ray_tune)]
            for kept, run in (sides if sample % 2 == 0 else sides[::-1]):  # the order flipped each round
                kept.append(run(configs, args.parallel, args.epochs, prune))
            print(f"sample: gs.sweep {ours[-1]['wall']:.1f} s ({ours[-1]['pruned']} stopped early), Ray Tune "
                  f"{tune_[-1]['wall']:.1f} s ({tune_[-1]['pruned']} stopped early)", flush=True)
    for name, side in (("gs.sweep", ours), ("Ray Tune Tuner", tune_)):
        print(f"{name}: wall-clock {spread([s['wall'] for s in side])} s, stopped early "
              f"{[s['pruned'] for s in side]} of {args.trials}, best val_loss {[round(s['best'], 4) for s in side]}")
    busy = [s["inside"] / s["leased"] for s in ours]
    print(f"gs.sweep busy fraction of leased GPU-time: {spread(busy)} (target >= 0.9)")
    pruning = ("ASHA grace 1 reduction 4 one bracket (Optuna SuccessiveHalvingPruner / Tune ASHAScheduler)"
               if prune else "no pruning on either side (equal work: every trial runs every epoch)")
    configured = (f"both: the same {args.trials} (lr, width) configurations as a grid, {args.parallel} in parallel, "
                  f"1 GPU a trial, {args.epochs} epochs, {pruning}, one discarded warm-up search each, samples "
                  "alternated with the order flipped each round; Tune reuse_actors=True")
    rows = [Row(f"{args.trials}-trial search of a small MLP, wall-clock" + ("" if prune else ", unpruned"), "s",
                [s["wall"] for s in ours], "Ray Tune Tuner", [s["wall"] for s in tune_], configured,
                "<= 0.5" if not prune else ""),
            Row("epochs trained per second of wall-clock (each side's work over its time)" +
                ("" if prune else ", unpruned"), "epochs/s", [s["epochs"] / s["wall"] for s in ours],
                "Ray Tune Tuner", [s["epochs"] / s["wall"] for s in tune_], configured, ">= 2"),
            Row("busy fraction of leased GPU-time (inside trials)", "", busy, configured=configured, goal=">= 0.9",
                goal_note="each trial is a call of its own (a lease, fresh ranks, a release: see the warm call "
                          "row) around a few tenths of a second of training on this small MLP, so that call's own "
                          "time is a large share of the GPU-time the trial leases; longer trials raise it")]
    if prune:
        rows.insert(1, Row("trials stopped early by ASHA", "trials", [s["pruned"] for s in ours], "Ray Tune Tuner",
                           [s["pruned"] for s in tune_], configured))
    write("sweep" if prune else "sweep-unpruned", rows, loadavg_before=load_before, script="" if prune else "sweep",
          folder=Path(args.out) if args.out else None)
    from statistics import median

    pace = median(s["epochs"] / s["wall"] for s in ours) / median(s["epochs"] / s["wall"] for s in tune_)
    print(f"ratio gs.sweep/ray_tune wall-clock: {median(s['wall'] for s in ours) / median(s['wall'] for s in tune_):.3f}"
          + (" (target <= 0.5: equal work)" if not prune else " (unequal work: each pruned different trials)"))
    print(f"ratio gs.sweep/ray_tune epochs trained per second: {pace:.3f} (target >= 2)")


if __name__ == "__main__":
    main()
