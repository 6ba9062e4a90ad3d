"""The lock-file probe behind every "stale folder" judgement (run/node/lockfile.py): real files,
real flocks held by another process."""
from __future__ import annotations

import os
import subprocess
import sys

from gpusession.run.node.lockfile import LockState, lock_state

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_SH)  # as a rank holds its attempt's lock
print("held", flush=True)
sys.stdin.read()
"""


def test_a_lock_is_held_while_a_live_process_holds_it_and_free_once_that_process_is_gone(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert lock_state(str(lock)) is LockState.HELD
    finally:
        holder.kill()
        holder.wait()
    assert lock_state(str(lock)) is LockState.FREE
    assert lock_state(str(lock)) is LockState.FREE  # the probe itself let go


def test_a_missing_lock_and_a_link_in_its_place_are_told_apart(tmp_path):
    assert lock_state(str(tmp_path / ".lock")) is LockState.MISSING
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, tmp_path / ".held")
    assert lock_state(str(tmp_path / ".held")) is LockState.UNREADABLE  # never followed
