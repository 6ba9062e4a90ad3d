"""A repeat 4-rank DDP call spread over 2 hosts against the same call packed on one (issue 23,
item 5), on simulated hosts (tests/multihost/simcluster.py: network namespaces, needs root),
with where each rank's seconds go: to the function (fork, rendezvous), gs.prepare_model, 5
steps, 2 collectives, and the call's end after the last rank returned.

    sudo .venv/bin/python benchmarks/spread_ddp.py [--samples 6]

Writes benchmarks/results/spread_ddp.json; the last line printed is the ratio spread / packed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _results import Row, spread, write  # noqa: E402

from tests.multihost.simcluster import SimCluster, can_run  # noqa: E402

PHASES = ("to_function_s", "prepare_model_s", "steps_s", "collectives_s")


def phase_medians(calls: list[dict]) -> dict:
    """Per phase, the median over calls of the slowest rank's time (the call waits for it)."""
    out = {phase: statistics.median(max(r[phase] for r in c["ranks"]) for c in calls) for phase in PHASES}
    out["after_last_rank_s"] = statistics.median(c["after_last_rank_s"] for c in calls)
    return {k: round(v, 3) for k, v in out.items()}


def described(phases: dict) -> str:
    names = {"to_function_s": "to the function", "prepare_model_s": "prepare_model", "steps_s": "5 steps",
             "collectives_s": "2 collectives", "after_last_rank_s": "call's end after the last rank"}
    return ", ".join(f"{names[k]} {v:g}" for k, v in phases.items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=6)
    args = parser.parse_args()
    reason = can_run()
    if reason:
        raise SystemExit(reason)
    loadavg_before = os.getloadavg()
    cluster = SimCluster(hosts=2, gpus_per_host=4, extra_env={"GPUSESSION_PG_TIMEOUT_S": "120"})
    cluster.start()
    try:
        status, out = cluster.run_python(cluster.head, str(HERE / "_spread_ddp_driver.py"), str(args.samples),
                                         timeout=1800)
    finally:
        cluster.stop()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if status != 0 or not lines:
        raise SystemExit(f"the driver failed (exit status {status}):\n{out[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    spread_calls, packed_calls = result["samples"]["spread"], result["samples"]["pack"]
    assert all(len(c["hosts"]) == 2 for c in spread_calls) and all(len(c["hosts"]) == 1 for c in packed_calls)
    phases = {"spread": phase_medians(spread_calls), "packed": phase_medians(packed_calls)}
    first = {k: round(v["wall_s"], 2) for k, v in result["first"].items()}
    row = Row(measure="repeat 4-rank DDP call (prepare_model(Linear(4, 1)), 5 steps, all_reduce, all_gather), "
                      "spread over 2 hosts, wall-clock",
              unit="s", gpusession_samples=[c["wall_s"] for c in spread_calls],
              alternative="the same gpusession call packed on one host",
              alternative_samples=[c["wall_s"] for c in packed_calls],
              configured="simulated hosts (network namespaces), 4 logical GPUs on each of 2 hosts, gloo on CPU; "
                         "one warm-up call each, then spread and packed calls alternated (the first flipped each time)",
              goal="<= 1.5", note=f"slowest rank's phases, median s: spread {described(phases['spread'])}; "
                                  f"packed {described(phases['packed'])}; first calls (cold nodes): "
                                  f"spread {first['spread']:g} s, packed {first['pack']:g} s")
    path = write("spread_ddp", [row], loadavg_before=loadavg_before)
    for name, calls in (("spread", spread_calls), ("packed", packed_calls)):
        print(f"{name}: {spread([c['wall_s'] for c in calls])} s; phases {phases[name if name == 'spread' else 'packed']}")
    print(f"first calls: {first}; written to {path}")
    print(row.as_json()["ratio"])


if __name__ == "__main__":
    main()
