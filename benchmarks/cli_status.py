"""`gpusession status` wall-clock on an idle cluster with no Jupyter server: through the broker's
status endpoint (what the CLI does now on the head) vs joining Ray as a driver (what it did
before, and still does where no endpoint is announced), side by side in one run.

    .venv/bin/python benchmarks/cli_status.py [--samples 5]

A fresh local head with 4 logical GPUs in a private GPUSESSION_HOME (benchmarks/_cluster.py: the
way the test session's cluster starts, retried when a loaded machine misses Ray's 30 s start
window), its broker up and idle, and an empty Jupyter runtime directory (no server of yours).
Each sample is the installed `gpusession status` command as a whole subprocess, the way a user
types it. The Ray side is the same command with the endpoint's announcement moved away (the CLI
then falls back to Ray, as on a machine with no endpoint). Warm-up alike (one discarded run per
side), samples alternated. Writes benchmarks/results/cli_status.json; goal: median < 1.5 s.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import in_turn, local_cluster  # noqa: E402
from _results import Row, spread, write  # noqa: E402

CLI = str(Path(sys.executable).with_name("gpusession"))


def run(env: dict, *args: str) -> float:
    started = time.perf_counter()
    result = subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"gpusession {' '.join(args)} failed: {result.stdout}{result.stderr[-3000:]}")
    return elapsed


def wait_for_announcement(home: Path, timeout_s: float = 60.0) -> Path:
    """The broker's announcement in the cluster's directory under `home` (broker/storage/statedir.py)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = sorted(home.glob("clusters/*/status-endpoint.json"))
        if found:
            return found[0]
        if time.monotonic() > deadline:
            sys.exit(f"the broker announced no status endpoint under {home} within {timeout_s:.0f} s")
        time.sleep(0.1)


def sample(env: dict, announcement: Path, *, endpoint: bool) -> float:
    hidden = announcement.with_suffix(".hidden")
    if not endpoint:
        announcement.rename(hidden)
    try:
        return run(env, "status")
    finally:
        if not endpoint:
            hidden.rename(announcement)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with local_cluster():  # this process is the head's idle driver; GPUSESSION_HOME is private
        import ray

        from gpusession.broker import client

        client.call(client.broker().info)  # the broker is up, as after a first `gpusession status`
        home = Path(os.environ["GPUSESSION_HOME"])
        env = {k: v for k, v in os.environ.items() if k != "GPUSESSION_DB_PATH"}
        env.update(RAY_ADDRESS=ray.get_runtime_context().gcs_address,
                   JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"))  # no Jupyter server of yours is used
        announcement = wait_for_announcement(home)
        sample(env, announcement, endpoint=True), sample(env, announcement, endpoint=False)  # warm-up
        mine, theirs = [], []
        for round_ in range(args.samples):
            in_turn(round_, lambda: mine.append(sample(env, announcement, endpoint=True)),
                    lambda: theirs.append(sample(env, announcement, endpoint=False)))
        ray.kill(ray.get_actor(client.BROKER_NAME, namespace=client.NAMESPACE), no_restart=True)
    print(f"through the endpoint: {spread(mine)} s; joining Ray: {spread(theirs)} s")
    row = Row(measure="`gpusession status` on an idle cluster, no Jupyter server, wall-clock", unit="s",
              gpusession_samples=mine, alternative="the same command joining Ray as a driver (before this change)",
              alternative_samples=theirs,
              configured="both: the installed gpusession console script as a subprocess with RAY_ADDRESS "
                         "set, a local head with 4 logical GPUs, broker up and idle; the Ray side with the "
                         "endpoint's announcement moved away; alternated, the first flipped each time", goal="< 1.5 s")
    path = write("cli_status", [row], loadavg_before=load_before)
    document = row.as_json()
    print(f"wrote {path}")
    print(f"ratio {document['ratio']}")


if __name__ == "__main__":
    main()
