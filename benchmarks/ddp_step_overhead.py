"""Per-step time of the same DDP loop under @gs.distributed vs torchrun (2 ranks, gloo),
measured side by side in one run, alternating launchers (which goes first flips each round) to
share the machine's noise.

    .venv/bin/python benchmarks/ddp_step_overhead.py [--rounds 6] [--steps 200]

Step time is measured inside the loop (after 20 warm-up steps), so it shows what gpusession
adds while training runs (output capture, the event stream), not its setup. Warm-up alike: 20
untimed steps in every run on both sides (gpusession's one extra untimed call before the rounds
only starts the broker and its warm workers). Writes benchmarks/results/ddp_step_overhead.json.
Target: <= 1.03.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _cluster import in_turn, local_cluster, median  # noqa: E402
from ddp_loop import median_step, step_times  # noqa: E402
from _results import Row, write  # noqa: E402


def torchrun_median_step(steps: int) -> float:
    """One torchrun run; its step times, and (its TMPDIR) the log folder torchrun makes by default,
    in a folder removed afterwards."""
    folder = tempfile.mkdtemp(prefix="torchrun-bench-")
    out = os.path.join(folder, "times.json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
                        os.path.join(HERE, "ddp_loop.py"), out, str(steps)], check=True, capture_output=True,
                       env=dict(os.environ, TMPDIR=folder))
        with open(out) as f:
            return median_step(json.load(f))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6,
                        help="alternating rounds of each launcher (even: each goes first as often)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    args = parser.parse_args()
    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    loop = gs.distributed(gpus=2)(step_times)
    gs_runs, torchrun_runs = [], []
    load_before = os.getloadavg()
    with local_cluster():
        loop(10)  # start the broker and the warm workers outside the measurement
        for round_ in range(args.rounds):
            in_turn(round_, lambda: torchrun_runs.append(torchrun_median_step(args.steps)),
                    lambda: gs_runs.append(median_step(loop(args.steps))))
    gs_step, torchrun_step = median(gs_runs), median(torchrun_runs)
    print(f"torchrun: median step {torchrun_step * 1e3:.3f} ms (rounds: {', '.join(f'{t*1e3:.3f}' for t in torchrun_runs)})")
    print(f"@gs.distributed: median step {gs_step * 1e3:.3f} ms (rounds: {', '.join(f'{t*1e3:.3f}' for t in gs_runs)})")
    write("ddp_step_overhead", [Row(
        "per step of the same DDP loop (an unmodified torchrun script), 2 ranks, gloo", "ms",
        [t * 1e3 for t in gs_runs], "torchrun --nproc_per_node=2", [t * 1e3 for t in torchrun_runs],
        f"both: benchmarks/ddp_loop.py, {args.steps} timed steps after 20 warm-up steps per run, a run's "
        f"figure its median step; launchers alternated, the first flipped each round, {args.rounds} rounds",
        "<= 1.03")],
        loadavg_before=load_before)
    print(f"ratio gpusession/torchrun per step: {gs_step / torchrun_step:.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()
