"""The node host's socket folder (gpusession/run/node/warmdir.py): a host Ray ended leaves its
folder, and the next host on the node removes it; a live host's folder, another account's folder
and a symbolic link are left alone. Real folders, real locks, a real process holding one."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpusession.run.node import warmdir

HOLD = ("import fcntl, os, sys\n"
        "fd = os.open(os.path.join(sys.argv[1], '.held'), os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n")


def _held_by_another_process(path: str) -> subprocess.Popen:
    """A process that holds the folder's lock, as its host's process does, until it ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_live_hosts_folder_stays_and_once_its_process_is_gone_the_next_sweep_removes_it(tmp_path):
    made = warmdir.make(str(tmp_path))
    os.close(made.lock_fd)  # the lock passes to another process, which plays the host
    holder = _held_by_another_process(made.path)
    try:
        assert warmdir.sweep(str(tmp_path)) == []
        assert os.path.isdir(made.path)
    finally:
        holder.kill()
        holder.wait()
    assert warmdir.sweep(str(tmp_path)) == [made.path]
    assert not os.path.exists(made.path)


def test_a_folder_held_by_this_process_is_not_swept_and_remove_takes_it_away(tmp_path):
    made = warmdir.make(str(tmp_path))
    assert made.socket_path == os.path.join(made.path, "zygote.sock")
    assert os.stat(made.path).st_mode & 0o777 == 0o700
    assert warmdir.sweep(str(tmp_path)) == []
    made.remove()
    assert os.listdir(tmp_path) == []


def test_a_folder_without_a_lock_is_swept_only_after_the_grace(tmp_path):
    """An older version's folder, or one a host is still making (no lock file yet)."""
    old = tmp_path / "gpusession-warm-old"
    old.mkdir(mode=0o700)
    now = time.time()
    assert warmdir.sweep(str(tmp_path), now=now) == []
    assert warmdir.sweep(str(tmp_path), now=now + warmdir.UNLOCKED_GRACE_S + 1) == [str(old)]


def test_other_names_links_and_other_accounts_folders_are_left_alone(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another account needs root")
    later = time.time() + warmdir.UNLOCKED_GRACE_S + 1
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    (tmp_path / "gpusession-warm-link").symlink_to(elsewhere)
    (tmp_path / "something-else").mkdir()
    theirs = tmp_path / "gpusession-warm-theirs"
    theirs.mkdir()
    assert warmdir.sweep(str(tmp_path), uid=os.geteuid() + 1, now=later) == []  # as another account
    os.chown(theirs, 65534, 65534)  # nobody's: root sweeping for itself leaves it
    assert warmdir.sweep(str(tmp_path), now=later) == []
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "gpusession-warm-link", "gpusession-warm-theirs",
                                            "something-else"]
    assert (elsewhere / "keep").read_text() == "x"
