"""`jupyter server` with ray_address "local": the server starts its own Ray head (a `ray start`
subprocess) and broker, its kernels lease GPUs as their server-signed user without any setup, a
kernel cannot forge another user or act as admin, and the server stops the head at shutdown."""
from __future__ import annotations

import asyncio
import json
import textwrap

import pytest
from pytest_jupyter.jupyter_server import *  # jp_serverapp, jp_fetch and the fixtures they need
from traitlets.config import Config

from ..conftest import process_running

OWNER = "alice"

TRAIN = """
import gpusession as gs

@gs.distributed(gpus=2)
def train():
    import time
    time.sleep(3)
    return gs.context().world_size

print("RESULT", train(), train.last_run.lease_id)
"""

TRESPASS = """
import os
import gpusession as gs
from gpusession.broker import client
from gpusession.errors import NotAuthorized

me = {"user": os.environ["GPUSESSION_USER"], "signature": os.environ["GPUSESSION_IDENTITY"]}
attempts = {
    "set_quota": lambda: client.call(client.broker().set_quota, "alice", {"max_gpus": 99}, me),
    "signing_key": lambda: client.call(client.broker().signing_key, me),
}
os.environ["GPUSESSION_USER"] = "mallory"  # forge another user, keeping alice's signature
attempts["forged status"] = gs.status
attempts["forged lease"] = lambda: gs.lease(gpus=1)
for name, attempt in attempts.items():
    try:
        attempt()
        print("ALLOWED", name)
    except NotAuthorized:
        print("REFUSED", name)
"""


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path / "gs-home"))
    monkeypatch.setenv("GPUSESSION_USER", OWNER)  # the server's owner, hence its kernels' user
    return Config({
        "ServerApp": {"jpserver_extensions": {"gpusession": True}},
        "GPUSession": {"ray_address": "local", "local_gpus": 4, "db_path": str(tmp_path / "ledger.db"),
                       "require_signed_identity": True, "default_quota": {"max_gpus": 4}},
    })


async def run_in_kernel(serverapp, kernel_id: str, code: str) -> str:
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    await client.wait_for_ready(timeout=120)
    output: list[str] = []

    def collect(msg):
        content = msg["content"]
        output.append(content.get("text") or (f"{content['ename']}: {content['evalue']}" if "ename" in content else ""))

    await client.execute_interactive(textwrap.dedent(code), output_hook=collect, timeout=240)
    client.stop_channels()
    return "".join(output)


async def poll(fetch_json, path: str, predicate, timeout: float = 60.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = await fetch_json(path)
        if predicate(value):
            return value
        await asyncio.sleep(0.2)
    pytest.fail(f"{path} never satisfied the condition; last: {value}")


def test_the_server_runs_its_own_cluster_whose_kernels_lease_gpus_as_their_signed_user(
        jp_serverapp, jp_fetch, jp_asyncio_loop, tmp_path):
    app = jp_serverapp.extension_manager.extension_points["gpusession"].app
    app.backend.connected.result(timeout=180)
    head = app.backend.head
    assert head is not None and json.loads((tmp_path / "gs-home" / "local-head.json").read_text())["pid"] == head.pid

    async def fetch_json(path, **kwargs):
        return json.loads((await jp_fetch(*path.split("/"), **kwargs)).body)

    async def scenario():
        assert (await fetch_json("gpusession/api/cluster"))["gpus_total"] == 4
        assert (await jp_fetch("gpusession", "admin")).code == 200  # the owner administers an embedded cluster
        kernel = await fetch_json("api/kernels", method="POST", body=json.dumps({"name": "python3"}))
        training = asyncio.ensure_future(run_in_kernel(jp_serverapp, kernel["id"], TRAIN))
        running = await poll(fetch_json, "gpusession/api/leases", lambda leases: any(l["gpus"] == 2 for l in leases))
        output = await training
        usage = await fetch_json("gpusession/api/usage")
        trespass = await run_in_kernel(jp_serverapp, kernel["id"], TRESPASS)
        quota = await fetch_json(f"gpusession/api/quotas/{OWNER}")
        return running, output, usage, trespass, quota

    running, output, usage, trespass, quota = jp_asyncio_loop.run_until_complete(scenario())
    assert running[0]["user"] == OWNER and running[0]["state"] in ("granted", "placed")
    assert f"RESULT 2 {running[0]['lease_id']}" in output, output
    assert usage[0]["user"] == OWNER and usage[0]["gpu_seconds"] >= 2 * 3
    for attempt in ("set_quota", "signing_key", "forged status", "forged lease"):
        assert f"REFUSED {attempt}" in trespass, trespass
    assert quota["max_gpus"] == 4 and quota["is_default"]  # the refused set_quota changed nothing

    # at shutdown the kernels go first (still connected), then the head: none dies under a vanished cluster
    kernels = jp_serverapp.kernel_manager
    assert len(kernels.list_kernel_ids()) == 1
    jp_asyncio_loop.run_until_complete(app.stop_extension())
    assert kernels.list_kernel_ids() == []
    assert not process_running(head.pid)
    assert not (tmp_path / "gs-home" / "local-head.json").exists()
