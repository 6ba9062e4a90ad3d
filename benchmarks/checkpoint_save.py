"""What one gs.save_checkpoint costs a training step: the time rank 0 waits in the call (it returns
once the caller holds its own copy), for a 1 KB and a 10 MB state, on one node.

    .venv/bin/python benchmarks/checkpoint_save.py [--samples 5] [--saves 20]

Each sample is one 2-rank @gs.distributed call on a fresh local cluster (4 logical GPUs) in which
rank 0 saves --saves times per size; a sample's figure is the median of its saves. No alternative
is run: this is the README's "cost per save" (across nodes, add the transfer of the state).
Writes benchmarks/results/checkpoint_save.json.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster  # noqa: E402
from _results import Row, spread, write  # noqa: E402

SIZES = {"1 KB": 1 << 10, "10 MB": 10 << 20}


def save_times_ms(saves: int) -> dict:
    import gpusession as gs
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())

    @gs.distributed(gpus=2)
    def saving(saves: int, sizes: dict):
        import statistics
        import time

        import torch

        medians = {}
        for name, size in sizes.items():
            state = {"weights": torch.zeros(size // 4, dtype=torch.float32)}
            took = []
            for step in range(saves):
                state["step"] = step
                started = time.perf_counter()
                gs.save_checkpoint(state)
                took.append((time.perf_counter() - started) * 1e3)
            medians[name] = statistics.median(took)
        return medians

    return saving(saves, SIZES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with local_cluster():
        save_times_ms(2)  # the cluster's first call starts the broker and node host: not a save's cost
        samples = [save_times_ms(args.saves) for _ in range(args.samples)]
    configured = (f"rank 0 of a 2-rank call on one node saves {args.saves} times per size; a sample is the median "
                  "of its saves; one discarded call first; no alternative")
    rows = [Row(f"gs.save_checkpoint of a {name} state, time in the call", "ms", [s[name] for s in samples],
                configured=configured) for name in SIZES]
    for name in SIZES:
        print(f"{name}: {spread([s[name] for s in samples])} ms")
    write("checkpoint_save", rows, loadavg_before=load_before)
    print(f"save of 10 MB, median of {len(samples)} samples: {sorted(s['10 MB'] for s in samples)[len(samples) // 2]:.1f} ms")


if __name__ == "__main__":
    main()
