"""One simulated cluster (head + 2 hosts x 2 logical GPUs, see simcluster.py and README.md)
shared by every multi-host scenario of the session; skipped where namespaces cannot be made."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from .simcluster import SimCluster, can_run

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def sim_cluster():
    reason = can_run()
    if reason:
        pytest.skip(reason)
    cluster = SimCluster(hosts=2, gpus_per_host=2, extra_env={"GPUSESSION_PG_TIMEOUT_S": "60"})
    cluster.start()  # tears down what it made if it fails half way
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module", autouse=True)
def whole_cluster(sim_cluster):
    """Each module starts with the head up: if a scenario of an earlier module left it down (that
    module's test failed with why), the cluster is made again rather than failing this one too."""
    if not sim_cluster.gcs_running():
        warnings.warn(f"the simulated cluster's head was down; making the cluster again.{sim_cluster.head_report()}")
        sim_cluster.stop()
        sim_cluster.start()
    yield sim_cluster


def run_driver(cluster: SimCluster, script: str, *args: str, timeout: float = 300) -> dict:
    """Run a script of this folder on the head (as a user's kernel there); its `RESULT` line."""
    status, out = cluster.run_python(cluster.head, str(HERE / script), *args, timeout=timeout)
    what = f"{script} {' '.join(args)}"
    if status is None:
        pytest.fail(f"{what} did not finish within {timeout:.0f} s and was killed; output:\n{out[-4000:]}")
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert status == 0 and results, f"{what} failed (exit status {status}):\n{out[-4000:]}"
    return json.loads(results[-1][len("RESULT "):])
