"""A local Ray head (`gpusession cluster start`, `gpusession lab`, the hub's service) beside another
cluster on the same machine: every port Ray would take by default is taken already, and the head
still starts, runs a job and names no failure in its log (issue 28, item 8: the hub's head died
on Ray's client-server port 10001 while another cluster held it)."""
from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpusession.cluster import localhead

RAY_DEFAULT_PORTS = (6379, 10001, 52365, 8265)  # GCS, client server, dashboard agent, dashboard


@pytest.fixture
def default_ports_taken():
    """Listeners on Ray's default ports, as another cluster's head holds them (a port some other
    program already holds is taken just the same)."""
    held = []
    for port in RAY_DEFAULT_PORTS:
        sock = socket.socket()
        try:
            sock.bind(("0.0.0.0", port))
            sock.listen()
            held.append(sock)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
    yield
    for sock in held:
        sock.close()


@pytest.fixture
def own_home(monkeypatch):
    """A state directory and a short Ray temp directory (Ray's socket paths must stay under 107
    bytes) of this test's own, so the session cluster's records are untouched."""
    base = Path(tempfile.mkdtemp(prefix="gslh", dir="/tmp"))
    monkeypatch.setenv("GPUSESSION_HOME", str(base / "home"))
    monkeypatch.setenv("RAY_TMPDIR", str(base / "ray"))
    (base / "ray").mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_local_head_starts_and_runs_a_job_while_rays_default_ports_are_taken(default_ports_taken, own_home):
    head, started = localhead.start(gpus=1, timeout_s=180)
    try:
        assert started
        job = subprocess.run(
            [sys.executable, "-c", "import ray; ray.init(logging_level='ERROR'); "
                                   "print('ran', ray.get(ray.remote(lambda: 6 * 7).remote()))"],
            env={**os.environ, **head.client_env()}, capture_output=True, text=True, timeout=180)
        assert "ran 42" in job.stdout, f"a job on the head failed:\n{job.stderr[-2000:]}"
        log = Path(head.log_path).read_text(errors="replace")
        assert localhead.failure_cause(log) is None, f"a process of the head failed: {localhead.failure_cause(log)}"
        assert localhead.status() == head, "the head stopped after it had started"
    finally:
        localhead.stop(pid=head.pid)
