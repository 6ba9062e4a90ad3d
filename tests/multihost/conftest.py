"""One simulated cluster (head + 2 hosts x 2 logical GPUs, see simcluster.py and README.md)
shared by every multi-host scenario of the session; skipped where namespaces cannot be made."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from ..session_order import items_after_module, takes
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
def whole_cluster(request, sim_cluster):
    """Each module starts with the head up: if a scenario of an earlier module left it down (that
    module's test failed with why), the cluster is made again rather than failing this one too.
    After the last module of the session that takes the cluster, it is stopped at once rather than
    at the session's end: its idle Ray nodes would otherwise share the 2-core machine with every
    module that runs after (test_the_hub_on_hosts's hosts, tests/shaped's clusters, tests/unit)."""
    if getattr(sim_cluster, "stopped_early", False):  # stopped after what looked like its last module
        sim_cluster.stopped_early = False
        sim_cluster.start()
    elif not sim_cluster.gcs_running():
        warnings.warn(f"the simulated cluster's head was down; making the cluster again.{sim_cluster.head_report()}")
        sim_cluster.stop()
        sim_cluster.start()
    yield sim_cluster
    if not any(takes(item, "sim_cluster") for item in items_after_module(request)):
        sim_cluster.stop()  # the session fixture's stop() at the end finds nothing left: it never raises
        sim_cluster.stopped_early = True


def run_driver(cluster: SimCluster, script: str, *args: str, timeout: float = 300) -> dict:
    """Run a script of this folder on the head (as a user's kernel there); its `RESULT` line."""
    status, out = cluster.run_python(cluster.head, str(HERE / script), *args, timeout=timeout)
    what = f"{script} {' '.join(args)}"
    if status is None:
        pytest.fail(f"{what} did not finish within {timeout:.0f} s and was killed; output:\n{out[-4000:]}")
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert status == 0 and results, f"{what} failed (exit status {status}):\n{out[-4000:]}"
    return json.loads(results[-1][len("RESULT "):])
