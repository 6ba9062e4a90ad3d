"""`gpusession hub` (root) meets paths another account put in its way: each start is refused with
a message naming the path, before anything runs, and root changes nothing it was pointed at.
Also: a network address without TLS is refused. No hub comes up in this module: every start here
stops at its checks, in seconds."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpusession.hub.plan import HubLayout

from ..accounts import add_account, remove_accounts
from ..conftest import ROOT
from .conftest import PREFIX, needs_root_and_setup


@pytest.fixture
def hostile():
    """A state directory and a service account name of this test's own; an attacker account
    ("bob") that owns things where root will look. All removed afterwards, by name."""
    reason = needs_root_and_setup()
    if reason:
        pytest.skip(reason)
    tag = f"gsp{os.getpid() % 100000}"
    base = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir="/tmp"))
    os.chmod(base, 0o755)
    layout = HubLayout(PREFIX, base / "state", f"{tag}s")
    attacker = f"{tag}b"
    try:
        yield layout, add_account(attacker, system=False)
    finally:
        remove_accounts([layout.service_user, attacker])
        shutil.rmtree(base, ignore_errors=True)
        if layout.ray_tmp.is_symlink() or layout.ray_tmp.is_file():
            layout.ray_tmp.unlink()
        elif layout.ray_tmp.exists():
            shutil.rmtree(layout.ray_tmp, ignore_errors=True)


def start_hub(layout: HubLayout, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpusession.cli", "hub", "--prefix", str(layout.prefix),
                           "--state-dir", str(layout.state), "--service-user", layout.service_user, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def owner_and_mode(path: Path) -> tuple[int, int]:
    found = os.lstat(path)
    return found.st_uid, stat.S_IMODE(found.st_mode)


def test_a_symlink_in_place_of_the_services_directory_is_refused_and_its_target_left_alone(hostile, tmp_path):
    layout, _ = hostile
    target = tmp_path / "roots-folder"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    layout.state.mkdir(mode=0o755)
    layout.cluster_dir.symlink_to(target)
    done = start_hub(layout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{layout.cluster_dir} is a symbolic link, not a directory" in done.stdout
    assert owner_and_mode(target) == (0, 0o755)


def test_rays_temp_directory_made_first_by_another_account_is_refused_and_stays_theirs(hostile):
    layout, attacker = hostile
    layout.ray_tmp.mkdir()
    os.chmod(layout.ray_tmp, 0o777)
    os.chown(layout.ray_tmp, attacker.pw_uid, attacker.pw_gid)
    done = start_hub(layout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{layout.ray_tmp} belongs to {attacker.pw_name}" in done.stdout
    assert owner_and_mode(layout.ray_tmp) == (attacker.pw_uid, 0o777)


def test_a_temp_dir_given_with_the_option_is_checked_as_the_default_one_is(hostile, tmp_path):
    layout, attacker = hostile
    given = tmp_path / "rays-temp"
    given.mkdir()
    os.chown(given, attacker.pw_uid, attacker.pw_gid)
    done = start_hub(layout, "--temp-dir", str(given))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{given} belongs to {attacker.pw_name}" in done.stdout
    assert not layout.ray_tmp.exists()  # the default one was never made


def test_a_fifo_in_place_of_the_hubs_own_directory_is_refused(hostile):
    layout, _ = hostile
    layout.state.mkdir(mode=0o755)
    os.mkfifo(layout.hub_dir)
    done = start_hub(layout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{layout.hub_dir} is a FIFO, not a directory" in done.stdout
    assert stat.S_ISFIFO(os.lstat(layout.hub_dir).st_mode)


def test_a_network_address_without_tls_is_refused_before_anything_is_made(hostile):
    layout, _ = hostile
    done = start_hub(layout, "--ip", "0.0.0.0")
    assert done.returncode == 2 and "--ssl-cert and --ssl-key" in done.stdout
    assert not layout.state.exists()
