"""One real Ray cluster (4 logical GPUs) and one broker for the whole test session.

A Ray head takes ~10 s to start here, so every integration test shares it; the autouse
`no_leaked_gpus` check after each of them makes a test that leaks a lease fail by itself.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase

from gpusession.run.node import leftovers

from . import raysessions, skiplist

ROOT = Path(__file__).resolve().parent.parent
# Property tests: no per-example deadline (a loaded machine is slow, not wrong), failures kept in
# .hypothesis/ (gitignored) and replayed first on the next run, a reproduction blob printed.
hypothesis_settings.register_profile(
    "gpusession", deadline=None, print_blob=True,
    database=DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "examples")),
)
hypothesis_settings.load_profile("gpusession")
# Tests stop `gpusession hub` and `gpusession lab` with SIGINT, as Ctrl-C in their terminal. A
# shell without job control starts a background command (`pytest ... &` in a script) with SIGINT
# ignored, and every process it starts would inherit that: a hub that ignores Ctrl-C, killed after
# stop_hub's 2 minutes (seen: test_hub_stop failed with -9). Python's own handler is not inherited
# across exec, so with it here each child starts with SIGINT's default, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
CLUSTER_GPUS = 4
SKIPPED: list = []  # skiplist.Skipped of this session
UNEXPLAINED: list = []  # the no-silent-skip report, when CI as root had unlisted skips
LEFT: list = []  # folders in the temporary folder still held by a live process at the session's end
RAY_LOGS_KEPT: list = []  # the session's Ray session folders, kept because a test failed

# The fast loop (`pytest -m "not slow"`, README "Development") must stay under 3 minutes and still
# catch a broken run path. The rule: a test is slow when, besides the shared session cluster, it
#  (a) starts something heavy of its own: a Ray cluster, network namespaces, a browser, a
#      JupyterHub, a Jupyter server, a Jupyter kernel (an example notebook included), or another
#      Python process that imports Ray or torch (another user's kernel through `driver`, the
#      gpusession or jupyter CLI, torchrun, a warm parent, spawned ranks); or
#  (b) plays a scenario that lasts seconds by design: a rank, worker or broker killed (or dying) and
#      brought back, a grace period waited out, a fixed sleep over a second, a crowd of concurrent
#      callers, a whole sweep; or
#  (c) needs CUDA GPUs (tests/gpu: a Ray cluster of its own on the machine's real GPUs).
# Found by folder, fixture and module names where it can be (a new test there is caught without
# remembering the marker); the rest is listed by file (every test in it) or by file::test, with
# its reason. Everything else runs in the fast loop: unit tests and calls on the session cluster.
SLOW_FOLDERS = {
    "e2e": "drives a real browser against its own JupyterLab",
    "gpu": "runs ranks on real CUDA GPUs through a Ray cluster of its own",
    "multihost": "makes network namespaces and a simulated multi-host cluster",
    "hub": "starts its own JupyterHub",
}
SLOW_FIXTURES = {
    "jp_serverapp": "starts its own Jupyter server",
    "shared_server": "starts its own Jupyter server (one for its module: tests/integration/threaded_server.py)",
    "jupyter": "starts its own JupyterLab",
    "browser": "drives a real browser",
    "sim_cluster": "makes network namespaces and a simulated multi-host cluster",
    "driver": "starts another user's kernel: a Python process that joins the cluster",
}
# Names a test module imports to start a Jupyter kernel (tests/integration/kernels.py, nbclient)
KERNEL_STARTERS = {"Kernel": "starts a real Jupyter kernel", "NotebookClient": "runs a notebook in a real kernel"}
SLOW_TESTS = {
    "integration/test_gateway_limits.py::test_a_hello_dribbled_a_byte_a_second_is_refused_at_its_deadline_while_others_are_served":
        "dribbles a hello a byte a second past the gateway's 2 s hello deadline",
    "unit/test_labextension_bundle.py::test_jupyterlab_lists_the_extension_scripts_setup_installed_as_enabled":
        "runs the jupyter CLI in a subprocess",
    "integration/test_cli.py": "runs the gpusession CLI in subprocesses",
    "integration/test_ray_session_folders.py": "starts a Ray head of its own in a subprocess",
    "integration/test_host_kill.py": "starts and kills hundreds of processes in a network namespace",
    "integration/test_torchrun_parity.py": "runs torchrun",
    "integration/test_groups_runner.py": "runs pytest's collection three times in subprocesses (it imports torch)",
    "integration/test_frameworks.py": "runs torchrun and each framework under gpusession",
    "integration/test_zygote_sharing.py": "starts warm parents of its own (each imports torch)",
    "integration/test_rendezvous.py": "spawns rank processes that import torch",
    "integration/test_broker_load.py": "fifty concurrent callers; a broker killed under that load",
    "integration/test_elastic.py": "shrinks a run for a preemption and grows it back (grace periods)",
    "integration/test_queued_caller.py": "waits out the broker's queue heartbeat",
    "integration/test_localhead_ports.py": "starts a Ray head of its own beside the session's",
    "integration/test_result_too_large.py": "starts a Ray head of its own on a small tmpfs",
    "integration/test_lab_start.py": "runs `gpusession lab`: JupyterLab and a Ray head of its own",
    "integration/test_server_bad_config.py::test_jupyter_lists_the_gpusession_extension_as_enabled_and_valid":
        "runs the jupyter CLI in a subprocess",
    "integration/test_call_endings.py::test_warm_parents_killed_while_idle_are_replaced_and_the_next_call_succeeds":
        "kills the warm parents and waits for new ones to import torch",
    "integration/test_recovery.py::test_a_rank_killed_mid_run_restarts_from_its_checkpoint_and_ends_with_uninterrupted_weights":
        "kills a rank and waits for the run to restart",
    "integration/test_recovery.py::test_a_killed_worker_actor_on_a_host_that_answers_is_one_workers_loss_and_the_run_restarts":
        "kills a worker actor and waits for the run to restart",
    "integration/test_broker_lifecycle.py::test_a_newer_client_replaces_an_older_broker_and_keeps_its_ledger":
        "replaces the session's broker",
    "integration/test_broker_lifecycle.py::test_a_run_in_flight_survives_its_broker_being_replaced_by_another_client":
        "replaces the session's broker during a run",
    "integration/test_broker_lifecycle.py::test_an_older_broker_started_by_another_client_while_a_newer_one_replaces_it_is_replaced_too":
        "replaces the session's broker twice",
    "integration/test_broker_lifecycle.py::test_a_worker_stops_by_itself_when_its_leases_group_is_taken_back":
        "takes a lease's placement group back and waits for its worker to stop",
    "integration/test_preemption.py::test_a_within_quota_lease_of_equal_priority_is_not_preempted_by_a_request_waiting_past_the_grace_period":
        "waits out a preemption grace period",
    "integration/test_heartbeat.py::test_a_live_worker_keeps_beating_and_one_whose_process_is_killed_is_lost_at_once":
        "starts beat servers in fresh interpreters, kills one, and sleeps 1.5 s and 1.2 s",
    "integration/test_heartbeat.py::test_a_worker_that_cannot_be_reached_is_left_to_ray_not_declared_lost":
        "sleeps 1.5 s to show nothing happens",
    "integration/test_cli_status_endpoint.py::test_status_on_the_head_shows_the_brokers_status_without_importing_ray":
        "runs the gpusession CLI in a subprocess",
    "integration/test_cli_status_endpoint.py::test_a_user_sees_only_their_own_runs_through_the_endpoint":
        "runs the gpusession CLI in a subprocess",
    "integration/test_cli_status_endpoint.py::test_status_answers_through_ray_when_the_announced_endpoint_is_gone":
        "runs the gpusession CLI in a subprocess that joins the cluster through Ray",
    "integration/test_ray_guard.py": "runs a fresh interpreter that imports Ray",
    "integration/test_gateway_runs.py": "starts a gateway process that joins the cluster, and kernels beside it",
    "integration/test_detach.py": "starts a gateway process that joins the cluster, and kernels it outlives",
    "integration/test_gateway_lease.py": "starts a gateway process that joins the cluster, and kernels that hold leases",
    "integration/test_recovery.py::test_a_survivor_blocked_in_a_collective_is_torn_down_when_its_peer_dies":
        "kills a rank",
    "integration/test_call_endings.py::test_a_worker_process_that_dies_raises_worker_failed_naming_its_rank":
        "a rank process dies mid-run",
    "integration/test_sweep.py::test_sixteen_trials_run_four_at_a_time_prune_early_record_failures_and_find_the_best":
        "a whole sweep of sixteen trials",
    "integration/test_sweep.py::test_an_interrupted_sweep_releases_every_gpu_and_the_same_call_runs_only_the_missing_trials":
        "a whole sweep, interrupted and run again",
}


def slow_reason(folder: str, fixturenames, *, module_names=(), where: str = "") -> str | None:
    """Why a test is slow (the rule above); None when it runs in the fast loop. `where` is its
    "folder/file.py::test_name" (parameters left out), `module_names` the names its module defines."""
    if folder in SLOW_FOLDERS:
        return SLOW_FOLDERS[folder]
    by_fixture = next((SLOW_FIXTURES[name] for name in fixturenames if name in SLOW_FIXTURES), None)
    by_module = next((KERNEL_STARTERS[name] for name in module_names if name in KERNEL_STARTERS), None)
    listed = SLOW_TESTS.get(where.split("::")[0]) or SLOW_TESTS.get(where)
    return by_fixture or by_module or listed


def pytest_runtest_logreport(report):
    """Every skip, for the no-silent-skip check (tests/skiplist.py) at the session's end."""
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        SKIPPED.append(skiplist.Skipped(report.nodeid.removeprefix("tests/"), reason.removeprefix("Skipped: ")))


def pytest_sessionfinish(session, exitstatus):
    """In CI as root, a skip not listed in tests/expected_skips.toml with its reason fails the run."""
    if not skiplist.enforced(os.environ, os.geteuid()):
        return
    bad = skiplist.unexplained(SKIPPED, skiplist.load(skiplist.LIST.read_text()))
    if bad:
        UNEXPLAINED.append(skiplist.report(bad))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    for text in UNEXPLAINED:
        terminalreporter.write_sep("=", "unexplained skips", red=True)
        terminalreporter.write_line(text)
    if LEFT:
        terminalreporter.write_sep("=", "left in the temporary folder (a live process holds each)", yellow=True)
        for path in LEFT:
            terminalreporter.write_line(str(path))
    if RAY_LOGS_KEPT:
        terminalreporter.write_sep("=", "Ray's session folders of this session's clusters, kept for their logs "
                                        "(a test failed); remove them by name when done", yellow=True)
        for path in RAY_LOGS_KEPT:
            terminalreporter.write_line(str(path))


def pytest_collection_modifyitems(config, items):
    tests = ROOT / "tests"
    for item in items:
        path = Path(str(item.fspath))
        relative = path.relative_to(tests) if path.is_relative_to(tests) else Path(path.name)
        module = getattr(item, "module", None)
        where = f"{relative.as_posix()}::{getattr(item, 'originalname', item.name)}"
        folder = relative.parts[0] if len(relative.parts) > 1 else ""
        reason = slow_reason(folder, getattr(item, "fixturenames", ()),
                             module_names=vars(module) if module else (), where=where)
        if reason:
            item.add_marker(pytest.mark.slow(reason=reason))


@dataclass
class Cluster:
    address: str
    home: Path
    db_path: Path
    admin_token: str
    logical: bool  # the broker reports logical GPUs (no CUDA behind them): expected values follow it

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


@pytest.fixture(scope="session", autouse=True)
def no_folders_left_in_tmp(request):
    """The warm and scratch folders the session's clusters left in the temporary folder go at its
    end (gpusession/run/node/leftovers.py), and so do their Ray session folders unless a test
    failed (tests/raysessions.py: their logs tell why): set up before any cluster, so it ends
    after every one of them."""
    snapshot = leftovers.Snapshot.now()
    ray_sessions = raysessions.Snapshot.now()
    yield
    LEFT.extend(snapshot.remove_new())
    if request.session.testsfailed:
        RAY_LOGS_KEPT.extend(ray_sessions.new())
    else:
        LEFT.extend(ray_sessions.remove_ended(timeout_s=20.0))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    import ray

    home = tmp_path_factory.mktemp("gpusession-home")
    os.environ["GPUSESSION_HOME"] = str(home)  # the broker (a child of this head) inherits it
    os.environ.pop("RAY_ADDRESS", None)
    from gpusession.cluster.raycluster import init_local_head

    from gpusession.cluster.raycluster import LOGICAL_GPUS_RESOURCE

    # 4 logical GPUs on any machine: on one with real GPUs (fewer than 4, often) the marker keeps
    # them logical, so ranks train on the CPU as here instead of being handed GPU ids the machine
    # lacks; tests/gpu starts clusters of its own with the real GPUs.
    init_local_head(num_gpus=CLUSTER_GPUS, num_cpus=4, include_dashboard=False, logging_level=logging.ERROR,
                    log_to_driver=True, resources={LOGICAL_GPUS_RESOURCE: 1})
    from gpusession.broker import client
    from gpusession.broker.service.settings import BrokerConfig

    db_path = home / "ledger.db"
    broker = client.broker(BrokerConfig(db_path=str(db_path), preemption_grace_s=3.0, revoke_grace_s=3.0,
                                        heartbeat_timeout_s=3.0, claim_timeout_s=10.0))
    client.call(broker.info)  # started and answering before any test runs
    token = (db_path.parent / "admin_token").read_text().strip()
    logical = client.call(broker.cluster)["logical_gpus"]
    yield Cluster(ray.get_runtime_context().gcs_address, home, db_path, token, logical)
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
    from gpusession.observe import events

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
