"""`gpusession status`, `leases` and `quota` through the session's JupyterLab server, as its owner
types them in another terminal: the answer comes through the server's REST API, without joining
Ray (no Ray import: that alone takes over a second), and says what the broker holds."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpusession.broker import client

from ..conftest import ROOT, wait_for
from ..machine import cluster_line
from .conftest import ADMIN

# Run the CLI, then say whether Ray was ever imported: the fast path never needs it.
PROBE = "import sys; from gpusession.cli.main import main; code = main(sys.argv[1:]); print('RAY', 'ray' in sys.modules); sys.exit(code)"


def gpusession(cluster, jupyter, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = cluster.env(GPUSESSION_USER=ADMIN, JUPYTER_RUNTIME_DIR=str(jupyter.runtime_dir))
    env.pop("GPUSESSION_ADMIN_TOKEN", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))
    return done, time.monotonic() - started


@pytest.fixture(scope="module")
def announced(jupyter):
    wait_for(lambda: list(jupyter.runtime_dir.glob("gpusession-*.json")), timeout=120,
             message="the server's announcement for the CLI")


def test_status_answers_through_the_server_without_importing_ray(cluster, jupyter, announced):
    done, took = gpusession(cluster, jupyter, "status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cluster: {cluster_line(4, logical=cluster.logical)}")
    assert f"\n{ADMIN}: " in done.stdout and "RAY False" in done.stdout
    print(f"gpusession status through the server: {took:.2f} s (a fresh Python process)")


def test_quota_changes_and_leases_go_through_the_server_as_its_admin_owner(cluster, jupyter, announced, broker,
                                                                          admin):
    try:
        done, _ = gpusession(cluster, jupyter, "quota", "set", "erin", "--max-gpus", "3")
        assert done.returncode == 0 and "RAY False" in done.stdout, done.stderr
        assert client.call(broker.quota, "erin", admin)["max_gpus"] == 3
        refused, _ = gpusession(cluster, jupyter, "quota", "set", "erin", "--max-priority", "urgent")
        assert refused.returncode == 2 and "invalid choice" in refused.stderr
        listed, _ = gpusession(cluster, jupyter, "quota", "list")
        assert "erin" in listed.stdout and "RAY False" in listed.stdout
        leases, _ = gpusession(cluster, jupyter, "leases")
        assert leases.returncode == 0 and "RAY False" in leases.stdout
    finally:
        client.call(broker.reset_quota, "erin", admin)
