"""`gpusession status` on the head with no Jupyter server: through the broker's status endpoint
(no Ray import), showing what the broker's `status` shows over Ray; the Ray path when the
endpoint is gone; the endpoint serves nothing without its token."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import gpusession as gs
from gpusession.broker.http import status_endpoint
from gpusession.broker import client
from gpusession.identity import current_user

from ..conftest import ROOT

NO_SERVER = {"JUPYTER_RUNTIME_DIR": "/nonexistent-gpusession-test"}  # no Jupyter server's announcement


def status_cli(cluster, **env: str) -> tuple[dict, set[str]]:
    """`gpusession status --json` as a subprocess: what it printed and the modules it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpusession.cli", "status", "--json"],
                            env=cluster.env(**NO_SERVER, **env), capture_output=True, text=True, timeout=120,
                            cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return json.loads(result.stdout), imported


def over_ray(broker, user: str) -> dict:
    return client.call(broker.status, {"user": user, "signature": None})


def stable(status: dict) -> dict:
    """What both paths must agree on; ages and GPU-hours move on between the two calls."""
    return {"user": status["user"], "cluster": status["cluster"],
            "quota": {k: v for k, v in status["quota"].items() if k != "gpu_hours_7d"},
            "leases": [{k: lease[k] for k in ("lease_id", "user", "gpus", "state", "priority", "position", "notebook")}
                       for lease in status["leases"]]}


def test_status_on_the_head_shows_the_brokers_status_without_importing_ray(cluster, broker, quiet):
    held = gs.lease(gpus=1)
    try:
        printed, imported = status_cli(cluster)
        assert stable(printed) == stable(over_ray(broker, current_user()))
        assert [lease["lease_id"] for lease in printed["leases"]] == [held.lease_id]
        assert printed["cluster"]["gpus_leased"] == 1.0
    finally:
        held.release("done")
    assert not {"ray", "torch"} & imported, "the CLI imported Ray or torch on the endpoint's path"


def test_a_user_sees_only_their_own_runs_through_the_endpoint(cluster, broker, quiet):
    held = gs.lease(gpus=1)
    try:
        printed, _ = status_cli(cluster, GPUSESSION_USER="someone-else")
        assert printed["user"] == "someone-else" and printed["leases"] == []
        assert printed["quota"]["gpus_in_use"] == 0 and printed["cluster"]["gpus_leased"] == 1.0
    finally:
        held.release("done")


def test_status_answers_through_ray_when_the_announced_endpoint_is_gone(cluster, broker, tmp_path):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    dead = status_endpoint.Endpoint(f"http://127.0.0.1:{port}/status", "stale", cluster.address,
                                    socket.gethostname(), os.getpid())
    status_endpoint.write(tmp_path / status_endpoint.ANNOUNCE_NAME, dead)
    printed, imported = status_cli(cluster, GPUSESSION_DB_PATH=str(tmp_path / "ledger.db"))
    assert "ray" in imported, "the CLI should have joined Ray after the endpoint did not answer"
    assert stable(printed) == stable(over_ray(broker, current_user()))


def test_the_status_endpoint_serves_nothing_without_its_token(cluster, broker):
    announced = status_endpoint.read(cluster.home / status_endpoint.ANNOUNCE_NAME)
    assert announced is not None and announced.ray_address == cluster.address
    assert (cluster.home / status_endpoint.ANNOUNCE_NAME).stat().st_mode & 0o077 == 0, "announcement not private"
    for headers in ({}, {"Authorization": "token not-the-token"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{announced.url}?user=x", headers=headers), timeout=10)
        assert refused.value.code == 401 and b"gpus" not in refused.value.read()
    with pytest.raises(urllib.error.HTTPError) as elsewhere:
        urllib.request.urlopen(urllib.request.Request(announced.url.replace("/status", "/leases"),
                                                      headers={"Authorization": f"token {announced.token}"}),
                               timeout=10)
    assert elsewhere.value.code == 404
