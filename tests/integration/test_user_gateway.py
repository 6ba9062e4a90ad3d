"""A user's own gateway (gpusession/gateway/usergateway.py), which hosts detached runs outside the
hub: its directory and socket are the user's alone and another account is refused even when both
are loosened; with no run kept and no kernel connected it exits after its idle period, and after
that nothing is listed; it exits when its cluster's head goes. (Detached runs through it, its
surviving the kernel that started it: test_detach.py, the "user" hosting.)"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpusession.cluster import localhead
from gpusession.gateway import usergateway

from ..conftest import process_running, wait_for
from .test_gateway_runs import (Kernel, other_account, start_user_gateway, stop_user_gateways,  # noqa: F401
                                user_gateway_pids, user_kernel_env)


@pytest.fixture
def home():
    """A gpusession home of this account's (root's, 0700), its gateways stopped and removed after."""
    path = tempfile.mkdtemp(prefix="gs-user-gw-")
    yield path
    stop_user_gateways(path)
    shutil.rmtree(path, ignore_errors=True)


def _mode(path: Path) -> tuple[int, int]:
    found = os.lstat(path)
    return stat.S_IMODE(found.st_mode), found.st_uid


def test_its_socket_is_the_users_alone_and_another_account_is_refused_even_through_loosened_modes(
        cluster, home, other_account):
    path = Path(start_user_gateway(cluster, home))
    folder = path.parent
    assert folder == usergateway.directory_for(Path(home), cluster.address)
    assert _mode(folder) == (0o700, os.geteuid()) and _mode(path) == (0o600, os.geteuid())
    record = usergateway.record(folder)
    assert record["socket"] == str(path) and Path(record["log"]).exists() and _mode(Path(record["log"]))[0] == 0o600
    for loosened in (Path(home), folder.parent, folder):  # a careless chmod: only the gateway's own check is left
        os.chmod(loosened, 0o711)
    os.chmod(path, 0o666)
    stranger = Kernel(str(path), """
        try:
            say(listed=[r.run_id for r in gs.runs(all=True)])
        except gs.GPUSessionError as exc:
            say(error=str(exc))
    """, account=other_account)
    got = stranger.result()
    assert f"serves uid {os.geteuid()} alone" in got.get("error", ""), got
    assert f"uid {other_account.pw_uid} may not use it" in got["error"]


def test_with_no_run_and_no_kernel_it_exits_after_its_idle_period_and_then_nothing_is_listed(cluster, home):
    path = Path(start_user_gateway(cluster, home, **{usergateway.IDLE_ENV: "2"}))
    [pid] = user_gateway_pids(home)
    assert process_running(pid)
    wait_for(lambda: not process_running(pid), timeout=30, message="the idle user's gateway exited")
    assert not path.exists() and usergateway.record(path.parent) is None
    assert "no detached run and no connection for 2 s" in (path.parent / usergateway.LOG_NAME).read_text()
    k = Kernel(None, f"""
        from gpusession.gateway.reattach import cancel_run
        listed = gs.runs(all=True)
        try:
            gs.attach("{'a' * 32}")
        except gs.GPUSessionError as exc:
            say(listed=listed, error=str(exc), ray="ray" in sys.modules)
    """, env=user_kernel_env(cluster, home))
    got = k.result()
    assert got["listed"] == [] and got["ray"] is False, got
    assert f"no detached run of yours is kept on the cluster at {cluster.address}: your gateway" in got["error"]
    assert "is not running" in got["error"], got


@pytest.fixture
def own_head(monkeypatch):
    """A Ray head of this test's own (the session cluster stays), stopped by its pid after."""
    base = Path(tempfile.mkdtemp(prefix="gsugw", dir="/tmp"))  # Ray's socket paths stay under 107 bytes
    monkeypatch.setenv("GPUSESSION_HOME", str(base / "home"))
    monkeypatch.setenv("RAY_TMPDIR", str(base / "ray"))
    (base / "ray").mkdir()
    head, _ = localhead.start(gpus=1, timeout_s=180)
    try:
        yield head, str(base / "home")
    finally:
        localhead.stop(pid=head.pid)
        stop_user_gateways(str(base / "home"))
        shutil.rmtree(base, ignore_errors=True)


def test_it_exits_when_its_clusters_head_goes(own_head):
    head, home = own_head
    start_user_gateway(SimpleNamespace(address=head.address), home)
    [pid] = user_gateway_pids(home)
    localhead.stop(pid=head.pid)
    stopped_at = time.monotonic()
    wait_for(lambda: not process_running(pid), timeout=60, message="the user's gateway exited after its head")
    assert time.monotonic() - stopped_at < 30


def test_a_detach_naming_no_limit_gets_the_gateways_default_and_its_records_the_gateways_retention(cluster, home):
    """The admin's policy (here the user is their own admin: the variables of the kernel that
    starts the gateway): a run that names no max_duration gets the default, and an ended run's
    expiry is its end plus the retention."""
    from gpusession.gateway.keeping import MAX_DURATION_ENV, RETENTION_ENV

    policy = {MAX_DURATION_ENV: "5m", RETENTION_ENV: "2h"}
    path = start_user_gateway(cluster, home, **policy)
    k = Kernel(path, """
        @gs.distributed(gpus=1)
        def quick():
            return 7

        run = quick.submit(detach=True)
        value = run.result()
        row = next(r for r in gs.runs(all=True) if r.run_id == run.run_id)
        say(value=value, max_duration=row.max_duration, kept_s=row.expires - row.ended)
    """)
    got = k.result()
    assert got["value"] == 7 and got["max_duration"] == 300.0, got
    assert abs(got["kept_s"] - 7200.0) < 1.0, got


def test_a_bad_policy_variable_is_refused_by_the_detach_naming_it_and_starts_no_gateway(cluster, home):
    from gpusession.gateway.keeping import RETENTION_ENV

    k = Kernel(None, """
        @gs.distributed(gpus=1)
        def quick():
            return 7

        try:
            quick.submit(detach=True)
        except ValueError as exc:
            say(error=str(exc))
    """, env={**user_kernel_env(cluster, home), RETENTION_ENV: "10s"})
    got = k.result()
    assert got["error"].startswith(f"{RETENTION_ENV} is how long an ended detached run's result"), got
    assert user_gateway_pids(home) == []
