"""Four trainings of 2 GPUs each on 4 GPUs: one after another as blocking calls (blocking cells),
against `train.submit(...)` (what `%%gpu 2 --bg` does), two at a time, side by side in one run.

    .venv/bin/python benchmarks/background.py [--samples 6] [--steps 20] [--step-s 0.25]

Each training is 2 ranks x `steps` steps; a step is `step_s` seconds of GPU time (simulated
with a sleep: these are logical GPUs on a CPU machine, and two trainings on 2 shared cores would
measure the cores, not the scheduling) plus a real gloo all_reduce of a 1 MB gradient. Both sides
run warm (a first call before the samples, as in a kernel after its first cell), with the same
function and the same trainings; samples alternate, the first flipped each time (blocking,
background, background, blocking, ...). The
background side submits all four at once: two run, two wait in the broker's queue and start as
GPUs free. Result: benchmarks/results/background.json; the last line is the wall-clock ratio
background / blocking (goal <= 0.55).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import CLUSTER_GPUS, local_cluster  # noqa: E402

TRAININGS = 4
GPUS_EACH = 2


def training(steps: int, step_s: float) -> float:
    import time as clock

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    grad = torch.ones(256 * 1024)  # 1 MB of float32
    for step in range(steps):
        clock.sleep(step_s)  # the step's GPU time (simulated)
        dist.all_reduce(grad)
        grad.div_(dist.get_world_size())
    return float(grad[0])


def blocking(train, steps: int, step_s: float) -> float:
    started = time.perf_counter()
    for _ in range(TRAININGS):
        train(steps, step_s)
    return time.perf_counter() - started


PHASES: list[list[dict]] = []  # per background sample: each run's queued/setup/run seconds


def background(train, steps: int, step_s: float) -> float:
    started = time.perf_counter()
    runs = [train.submit(steps, step_s) for _ in range(TRAININGS)]
    for run in runs:
        run.result()
    elapsed = time.perf_counter() - started
    PHASES.append([{"queued_s": round(r.info.queued_s, 2), "setup_s": round(r.info.setup_s, 2),
                    "run_s": round(r.info.run_s, 2)} for r in runs])
    return elapsed


class SlowReleases(logging.Handler):
    """Counts releases that waited the full bound for Ray's view (run/caller/bundles.py's warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "after release" in record.getMessage():
            self.count += 1


def machine() -> dict:
    import ray
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    return {"cores": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
            "gpusession_commit": commit, "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.25)
    args = parser.parse_args()
    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())  # measure the runs, not printing
    slow_releases = SlowReleases()
    logging.getLogger("gpusession").addHandler(slow_releases)
    with local_cluster(gpus=CLUSTER_GPUS):
        train = gs.distributed(gpus=GPUS_EACH)(training)
        background(train, 1, 0.0)  # warm-up, alike for both sides: workers up and torch imported
        blocking(train, 1, 0.0)
        PHASES.clear()
        slow_releases.count = 0
        load_before = os.getloadavg()
        sides: dict[str, list[float]] = {"blocking": [], "background": []}
        for sample in range(args.samples):  # which side goes first flips each sample
            for name, side in (("blocking", blocking), ("background", background))[::1 if sample % 2 == 0 else -1]:
                sides[name].append(side(train, args.steps, args.step_s))
                print(f"sample {sample + 1} {name}: {sides[name][-1]:.2f} s", flush=True)
        info = machine()
        info["loadavg_before"] = [round(x, 2) for x in load_before]
    ours, theirs = statistics.median(sides["background"]), statistics.median(sides["blocking"])
    ratio = ours / theirs
    row = {"measure": f"{TRAININGS} trainings of {GPUS_EACH} GPUs on {CLUSTER_GPUS} GPUs, wall-clock", "unit": "s",
           "gpusession": round(ours, 3), "gpusession_samples": [round(x, 3) for x in sides["background"]],
           "alternative": f"the same {TRAININGS} as blocking cells (calls one after another)",
           "alternative_value": round(theirs, 3), "alternative_samples": [round(x, 3) for x in sides["blocking"]],
           "configured": (f"train.submit x{TRAININGS} (as %%gpu {GPUS_EACH} --bg), two at a time by the broker, vs "
                          f"{TRAININGS} blocking calls; each {args.steps} steps of {args.step_s:g} s simulated GPU "
                          "time + a 1 MB gloo all_reduce; warm workers on both sides"),
           "spread": {"gpusession": round(max(sides["background"]) - min(sides["background"]), 3),
                      "alternative": round(max(sides["blocking"]) - min(sides["blocking"]), 3)},
           "ratio": round(ratio, 3), "goal": "<= 0.55", "simulated": True,
           "background_phases": PHASES, "releases_that_waited_5s": slow_releases.count}
    results = {"benchmark": "background", "command": "python benchmarks/background.py " + " ".join(sys.argv[1:]),
               "machine": info, "rows": [row]}
    out = os.path.join(os.path.dirname(__file__), "results", "background.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    for sample, phases in enumerate(PHASES, 1):
        print(f"background sample {sample}: " + "; ".join(
            f"queued {p['queued_s']:.2f} setup {p['setup_s']:.2f} run {p['run_s']:.2f}" for p in phases))
    print(f"releases that waited the full {5} s for Ray's view: {slow_releases.count}")
    print(f"background median {ours:.2f} s (spread {row['spread']['gpusession']:.2f}), blocking median "
          f"{theirs:.2f} s (spread {row['spread']['alternative']:.2f}); results in {out}")
    print(f"ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
