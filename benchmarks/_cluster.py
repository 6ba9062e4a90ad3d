"""A fresh local Ray cluster with logical GPUs for a benchmark, and a small timing helper."""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

CLUSTER_GPUS = 4
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.raysessions: the test suite's removal of Ray's session folders


@contextmanager
def local_cluster(*, gpus: int = CLUSTER_GPUS, cpus: int = 4):
    import ray

    from gpusession.cluster.raycluster import init_local_head
    from gpusession.run.node.leftovers import Snapshot

    from tests.raysessions import Snapshot as RaySessions

    before = Snapshot.now()  # the warm and scratch folders already in the temporary folder
    ray_sessions = RaySessions.now()  # and Ray's session folders
    home = tempfile.mkdtemp(prefix="gpusession-bench-")
    os.environ["GPUSESSION_HOME"] = home  # a private ledger: benchmarks never touch yours
    os.environ.pop("RAY_ADDRESS", None)
    init_local_head(num_gpus=gpus, num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR,
                    log_to_driver=False)
    failed = True
    try:
        yield
        failed = False
    finally:
        ray.shutdown()
        shutil.rmtree(home, ignore_errors=True)  # its ledger and keys: nothing of a run stays behind
        for path in before.remove_new():  # what this cluster's hosts and ranks left, once unlocked
            print(f"left in the temporary folder (still held): {path}", flush=True)
        if failed:  # its logs tell why
            for path in ray_sessions.new():
                print(f"kept for its logs (the benchmark failed): {path}", flush=True)
        else:
            for path in ray_sessions.remove_ended(timeout_s=20.0):
                print(f"left in Ray's temporary folder (still in use): {path}", flush=True)


def timed(fn, repeat: int) -> list[float]:
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        durations.append(time.perf_counter() - started)
    return durations


def in_turn(round_: int, *sides) -> None:
    """Run each side once: in the order given on even rounds, reversed on odd ones, so that no
    side always runs first (on a machine just quiet) or last (after the others' load)."""
    for side in sides if round_ % 2 == 0 else sides[::-1]:
        side()


def median(values) -> float:
    return statistics.median(values)
