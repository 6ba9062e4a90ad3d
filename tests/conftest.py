"""One real Ray cluster (4 logical GPUs) and one broker for the whole test session.

A Ray head takes ~10 s to start here, so every integration test shares it; the autouse
`no_leaked_gpus` check after each of them makes a test that leaks a lease fail by itself.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase

ROOT = Path(__file__).resolve().parent.parent
# Property tests: no per-example deadline (a loaded machine is slow, not wrong), failures kept in
# .hypothesis/ (gitignored) and replayed first on the next run, a reproduction blob printed.
hypothesis_settings.register_profile(
    "gpusession", deadline=None, print_blob=True,
    database=DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "examples")),
)
hypothesis_settings.load_profile("gpusession")
CLUSTER_GPUS = 4

# The fast loop (`pytest -m "not slow"`, README "Development") leaves out every test that starts
# something heavy of its own. Marked here by folder and fixture, so a new test in these folders or
# using these fixtures is caught without remembering the marker; a test that starts its own Ray
# cluster in a subprocess says so with an explicit @pytest.mark.slow.
SLOW_FOLDERS = {
    "e2e": "drives a real browser against its own JupyterLab",
    "multihost": "makes network namespaces and a simulated multi-host cluster",
    "hub": "starts its own JupyterHub",
}
SLOW_FIXTURES = {
    "jp_serverapp": "starts its own Jupyter server",
    "jupyter": "starts its own JupyterLab",
    "browser": "drives a real browser",
    "sim_cluster": "makes network namespaces and a simulated multi-host cluster",
}


def slow_reason(folder: str, fixturenames) -> str | None:
    """Why a test is slow by where it lives or what it uses; None when neither says so."""
    if folder in SLOW_FOLDERS:
        return SLOW_FOLDERS[folder]
    return next((SLOW_FIXTURES[name] for name in fixturenames if name in SLOW_FIXTURES), None)


def pytest_collection_modifyitems(config, items):
    tests = ROOT / "tests"
    for item in items:
        path = Path(str(item.fspath))
        folder = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""
        if slow_reason(folder, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@dataclass
class Cluster:
    address: str
    home: Path
    db_path: Path
    admin_token: str

    def env(self, **extra: str) -> dict:
        """Environment for a subprocess that should join this cluster as another user's kernel."""
        env = dict(os.environ)
        env.update({"RAY_ADDRESS": self.address, "GPUSESSION_HOME": str(self.home),
                    "PYTHONUNBUFFERED": "1"})
        env.update(extra)
        return env


def wait_for(predicate, *, timeout: float, interval: float = 0.02, message: str = "condition"):
    """Poll until predicate() is truthy; returns its value, fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{message} not reached within {timeout} s")
        time.sleep(interval)


def process_running(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie has). One call: a process that ends
    between "does it exist" and "what is its state" is not running, never an error."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def take_back_from_a_stuck_caller(caller, broker, admin) -> None:
    """After a failed step: if `caller` (a thread holding a lease) still runs, revoke every open
    lease and wait for it, so its GPUs are not held into the next tests."""
    if not caller.is_alive():
        return
    from gpusession.broker import client

    for row in client.call(broker.leases, admin):
        client.call(broker.revoke, row["lease_id"], admin)
    caller.join(60)


def free_gpus() -> float:
    import ray

    return ray.available_resources().get("GPU", 0.0)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    import ray

    home = tmp_path_factory.mktemp("gpusession-home")
    os.environ["GPUSESSION_HOME"] = str(home)  # the broker (a child of this head) inherits it
    os.environ.pop("RAY_ADDRESS", None)
    from gpusession.cluster.raycluster import init_local_head

    init_local_head(num_gpus=CLUSTER_GPUS, num_cpus=4, include_dashboard=False, logging_level=logging.ERROR,
                    log_to_driver=True)
    from gpusession.broker import client
    from gpusession.broker.settings import BrokerConfig

    db_path = home / "ledger.db"
    broker = client.broker(BrokerConfig(db_path=str(db_path), preemption_grace_s=3.0, revoke_grace_s=3.0,
                                        heartbeat_timeout_s=3.0, claim_timeout_s=10.0))
    client.call(broker.info)  # started and answering before any test runs
    token = (db_path.parent / "admin_token").read_text().strip()
    yield Cluster(ray.get_runtime_context().gcs_address, home, db_path, token)
    from gpusession.broker.client import BROKER_NAME, NAMESPACE

    try:
        ray.kill(ray.get_actor(BROKER_NAME, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        pass
    ray.shutdown()


@pytest.fixture
def broker(cluster):
    from gpusession.broker import client

    return client.broker()


@pytest.fixture
def admin(cluster):
    return {"token": cluster.admin_token, "user": "admin"}


@pytest.fixture(autouse=True)
def no_leaked_gpus(request):
    """After every test that used the cluster: no open lease in the broker, every GPU free in Ray."""
    yield
    if "cluster" not in request.fixturenames:
        return
    from gpusession.broker import client

    broker = client.broker()
    token = request.getfixturevalue("cluster").admin_token

    def clean():
        open_leases = client.call(broker.leases, {"token": token, "user": "admin"})
        return not open_leases and free_gpus() == CLUSTER_GPUS

    wait_for(clean, timeout=10, message="every lease closed and every GPU free after the test")


@pytest.fixture
def quiet():
    """Make calls in this test render nowhere (the console renderer is tested on its own)."""
    from gpusession import events

    events.set_observer_factory(lambda world_size: events.Observer())
    yield
    events.set_observer_factory(None)


class Driver:
    """Another Python process (another user's kernel) connected to the session cluster."""

    def __init__(self, cluster: Cluster, code: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], env=cluster.env(**env),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT),
        )
        self.lines: list[str] = []

    def wait_for_line(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return line.strip()
        self.kill()
        pytest.fail(f"driver never printed {prefix!r}; output:\n{''.join(self.lines)}")

    def kill(self) -> float:
        """SIGKILL (as a dying kernel); returns when it happened."""
        killed_at = time.monotonic()
        self.proc.kill()
        self.proc.wait()
        return killed_at

    def finish(self, timeout: float = 120.0) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        return "".join(self.lines) + (out or "")


@pytest.fixture
def driver(cluster):
    started: list[Driver] = []

    def start(code: str, **env: str) -> Driver:
        d = Driver(cluster, code, **env)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.kill()
