"""The test session's removal of Ray's session folders (tests/raysessions.py) against a real Ray
head: its folder counts as in use while the cluster runs (its processes keep their logs open),
and goes once the cluster has stopped."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from tests import raysessions

from ..conftest import wait_for

HEAD = """
import sys, ray
ray.init(address="local", num_cpus=1, include_dashboard=False)
print("READY", flush=True)
sys.stdin.read()  # until the test closes stdin
ray.shutdown()
"""


def test_a_clusters_session_folder_stays_while_it_runs_and_goes_once_it_has_stopped():
    tmp = tempfile.mkdtemp(prefix="gsrs-")  # short: Ray's socket paths live under it
    try:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_TMPDIR"] = tmp
        snapshot = raysessions.Snapshot.now(env)
        head = subprocess.Popen([sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            said = []
            while not said or not said[-1].startswith("READY"):  # Ray's own lines come first
                said.append(head.stdout.readline())
                assert said[-1], "the head ended before it was ready:\n" + "".join(said)
            (folder,) = snapshot.new()
            assert (folder / "logs").is_dir()
            assert snapshot.remove_ended() == [folder] and folder.exists()  # running: left alone
        finally:
            head.stdin.close()
            head.wait(60)
        wait_for(lambda: not snapshot.remove_ended(), timeout=30, message="the stopped cluster's folder removed")
        assert not folder.exists() and not os.path.lexists(snapshot.root / raysessions.LATEST)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
