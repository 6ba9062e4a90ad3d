"""Two real Ray clusters whose users share one home directory: each broker keeps its own ledger,
admin token and identity key, and finds them again when Ray restarts it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import ray
from ray.experimental import internal_kv

from gpusession.broker.http import status_endpoint
from gpusession.broker.storage import statedir
from gpusession.broker.service.service import BrokerService

from ..conftest import ROOT

pytestmark = pytest.mark.slow  # starts a second Ray cluster of its own

ANOTHER_CLUSTER = """
import json, logging, sys
import ray
for attempt in range(3):  # on a loaded machine Ray's agents may miss the raylet's start window
    try:
        ray.init(address="local", num_gpus=1, num_cpus=1, include_dashboard=False, logging_level=logging.ERROR)
        break
    except Exception as exc:
        if "timed out during startup" not in str(exc) or attempt == 2:
            raise
        ray.shutdown()
from gpusession.broker import client
info = client.call(client.broker().info)
ledger = client.ledger_path_here()
token = open(ledger.rsplit("/", 1)[0] + "/admin_token").read().strip()
print("CLAIMED " + json.dumps({"ledger": ledger, "ledger_id": info["ledger_id"], "token": token}), flush=True)
sys.stdin.readline()  # holds its directory until the test is done
"""


def _start(home) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GPUSESSION_DB_PATH")}
    env.update(GPUSESSION_HOME=str(home), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(ANOTHER_CLUSTER)], env=env, cwd=str(ROOT),
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _line(proc: subprocess.Popen, prefix: str, timeout: float = 240.0) -> dict:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    raise AssertionError(f"no {prefix.strip()} line; output:\n{''.join(seen)}")


def _where(broker, home) -> dict:
    """The session cluster's default-path broker: its directory as recorded in this cluster's Ray."""
    ray.get(broker.version.remote())  # its constructor chose and recorded the directory
    recorded = internal_kv._internal_kv_get(statedir.KV_KEY, namespace=statedir.KV_NAMESPACE).decode()
    directory = (home / recorded).resolve()
    token = (directory / "admin_token").read_text().strip()
    info = ray.get(broker.info.remote({"user": "admin", "token": token}))
    return {"ledger": info["db_path"], "ledger_id": info["ledger_id"], "token": token, "pid": info["pid"]}


def test_two_clusters_sharing_a_home_never_share_a_ledger(cluster, tmp_path):
    """The session cluster and another one started here, both with no ledger path configured."""
    # As on a fresh head, nothing recorded yet: an earlier test may have left this cluster's
    # record ("." for a broker that took over the session's home, e.g. one a client created
    # while the session's broker was being replaced), and the record is where a broker goes.
    # The session's broker was started on an explicit ledger, which is recorded too: a broker
    # started here with defaults would open it (statedir.py), so that record goes for the test.
    recorded = internal_kv._internal_kv_get(statedir.KV_KEY, namespace=statedir.KV_NAMESPACE)
    internal_kv._internal_kv_del(statedir.KV_KEY, namespace=statedir.KV_NAMESPACE)
    explicit = internal_kv._internal_kv_get(statedir.KV_LEDGER_KEY, namespace=statedir.KV_NAMESPACE)
    internal_kv._internal_kv_del(statedir.KV_LEDGER_KEY, namespace=statedir.KV_NAMESPACE)
    other = _start(tmp_path)
    broker = ray.remote(BrokerService).options(  # this cluster's broker as a fresh head would start it
        name="state-dir-test", namespace="gpusession-test", max_restarts=1, num_cpus=0,
        runtime_env={"env_vars": {"GPUSESSION_HOME": str(tmp_path)}}).remote({})
    try:
        here = _where(broker, tmp_path)
        there = _line(other, "CLAIMED ")
        assert here["ledger"] != there["ledger"] and here["ledger_id"] != there["ledger_id"]
        assert here["token"] != there["token"]
        assert {Path(here["ledger"]).parent.parent, Path(there["ledger"]).parent.parent} == {tmp_path / "clusters"}
        ray.kill(broker, no_restart=False)  # the broker's process dies; Ray starts it again
        deadline = time.monotonic() + 90
        while True:
            try:
                again = _where(broker, tmp_path)
                if again["pid"] != here["pid"]:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline, "the broker did not come back"
            time.sleep(0.2)
        assert {k: again[k] for k in ("ledger", "ledger_id", "token")} == {k: here[k] for k in ("ledger", "ledger_id", "token")}
        announced = status_endpoint.read(Path(again["ledger"]).with_name(status_endpoint.ANNOUNCE_NAME))
        assert announced is not None and announced.pid == again["pid"], "the restarted broker's status endpoint"
    finally:
        ray.kill(broker, no_restart=True)
        internal_kv._internal_kv_del(statedir.KV_KEY, namespace=statedir.KV_NAMESPACE)
        if recorded is not None:  # the session's broker, if it restarts, goes back where it was
            internal_kv._internal_kv_put(statedir.KV_KEY, recorded, namespace=statedir.KV_NAMESPACE)
        if explicit is not None:
            internal_kv._internal_kv_put(statedir.KV_LEDGER_KEY, explicit, namespace=statedir.KV_NAMESPACE)
        try:
            other.communicate("done\n", timeout=60)
        except subprocess.TimeoutExpired:
            other.kill()
            other.wait()
