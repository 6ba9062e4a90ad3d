"""tests/multihost/hostkill.py: a simulated host's processes end at once, none running after the
kill began, even where killing a parent first orphans a stopped process group (the kernel then
sends that group SIGHUP and SIGCONT: with SIGSTOP-then-SIGKILL, as simcluster.kill_namespace
does, the resumed process runs its SIGHUP handler before its own turn comes, here every time)."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.multihost.hostkill import FREEZER, kill_at_once
from tests.multihost.simcluster import can_run, namespace_pids

from ..conftest import wait_for

# P leads a session (as a host's first process does) and starts SLEEPERS processes, then C in a
# process group of its own; C's SIGHUP handler writes a file. Killed in pid order, P goes first,
# C's group is orphaned, and C is killed only after the sleepers.
TREE = r'''
import os, signal, sys, time
out, sleepers = sys.argv[1], int(sys.argv[2])
os.setsid()
for _ in range(sleepers):
    if os.fork() == 0:
        while True:
            time.sleep(1)
if os.fork() == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGHUP, lambda *_: open(out, "w").write("C ran after the kill began"))
    open(out + ".ready", "w").close()
    while True:
        time.sleep(1)
while True:
    time.sleep(1)
'''
SLEEPERS = 200


@pytest.fixture
def namespace():
    reason = can_run()
    if reason:
        pytest.skip(reason)
    name = f"gshk{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_process_whose_parent_is_killed_first_runs_nothing_after_the_kill_began_and_every_process_goes(
        namespace, tmp_path):
    if not FREEZER.is_dir():
        pytest.skip("no cgroup v1 freezer on this machine: kill_at_once falls back to stop-then-kill")
    out = tmp_path / "acted"
    for _ in range(3):
        host = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", TREE, str(out),
                                 str(SLEEPERS)])
        try:
            wait_for(lambda: os.path.exists(f"{out}.ready"), timeout=60, message="the processes started")
            assert kill_at_once(namespace) == SLEEPERS + 2
            host.wait(10)
            assert not out.exists(), out.read_text()
            assert namespace_pids(namespace) == []
            assert not list(FREEZER.glob(f"gsmh-kill-{namespace}-*"))  # its freezer group removed
        finally:
            if host.poll() is None:
                host.kill()
            os.unlink(f"{out}.ready")
