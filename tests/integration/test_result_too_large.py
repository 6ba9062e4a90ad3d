"""A result too large for Ray's object store (issue 33, item 5): on a node whose object store is
small and whose disk (Ray's temp directory, where Ray spills and falls back to) is too full to
take it, a call that returns more than fits fails with ResultTooLarge naming the rank, the size,
the node and what to do, is not retried, and its GPUs are free when the error reaches the caller.

A Ray head of this module's own: its temp directory on a 200 MB tmpfs (root mounts it; CI runs
as root), an object store of 100 MB, free ports for everything it opens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from gpusession.cluster import localhead

from ..conftest import ROOT

SCRIPT = textwrap.dedent("""
    import json, time
    import numpy, ray
    import gpusession as gs

    @gs.distributed(gpus=1, max_failures=2)
    def big():
        return numpy.ones(300 * 2**20, dtype=numpy.uint8)

    said = {}
    try:
        big()
    except Exception as exc:
        said.update(type=type(exc).__name__, message=str(exc), rank=getattr(exc, "rank", None))
    free = ray.available_resources().get("GPU", 0.0)
    said["free_gpus_at_error"], said["gpus"] = free, ray.cluster_resources().get("GPU", 0.0)
    print("RESULT " + json.dumps(said), flush=True)
""")


@pytest.fixture(scope="module")
def small_head():
    """RAY_ADDRESS of a head whose temp directory is a 200 MB tmpfs and whose store holds 100 MB."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs for Ray's temp directory: needs root (CI runs as root)")
    base = Path(tempfile.mkdtemp(prefix="gsbig", dir="/tmp"))
    temp, home = base / "ray", base / "home"
    temp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200M,mode=0700", "tmpfs", str(temp)], check=True)
    port = localhead._free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GPUSESSION_HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    log = open(base / "head.log", "w")
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--include-dashboard=false", "--disable-usage-stats", "--num-gpus=2", "--num-cpus=2",
         "--object-store-memory=100000000", f"--temp-dir={temp}", *localhead.port_options(localhead._free_port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    finally:
        # SIGTERM, then SIGKILL to the head and every process under it: `ray start --block` takes
        # ~30 s to stop gracefully on a loaded machine, and nothing of this throwaway head is kept
        localhead.terminate(head.pid, timeout_s=5)
        head.wait(timeout=30)
        log.close()
        for _ in range(50):  # the raylet's children may hold the mount a moment longer
            if subprocess.run(["umount", str(temp)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def test_a_result_larger_than_the_object_store_and_its_disk_fails_clearly_once_and_frees_the_gpus(small_head):
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=small_head, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    said = json.loads(lines[-1][len("RESULT "):])
    assert said["type"] == "ResultTooLarge" and said["rank"] == 0, said
    message = said["message"]
    assert message.startswith("Rank 0's result (315 MB) did not fit in Ray's object store on "), message
    assert "Every worker was stopped and the 1 GPUs released. Return less" in message, message
    said_to_user = (done.stdout + done.stderr).lower()
    assert "failed: resulttoolarge" in said_to_user and "restart" not in said_to_user, said_to_user[-3000:]  # never retried
    assert said["free_gpus_at_error"] == said["gpus"] == 2.0, said
