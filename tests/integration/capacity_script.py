"""Run by test_broker_capacity.py in its own process: a 2-node Ray cluster on this machine
(ray.cluster_utils.Cluster: a head with 2 logical GPUs, one node with 2 more). The node's
processes are killed as a crashed host's would be; later a node joins again."""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import threading
import time

from ray.cluster_utils import Cluster

import gpusession as gs
from gpusession import events

os.environ["GPUSESSION_HOME"] = tempfile.mkdtemp(prefix="gpusession-capacity-")
for attempt in range(3):  # on a loaded machine a raylet may miss Ray's startup window
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=2, num_gpus=2, include_dashboard=False)  # the head (the broker lives here)
        doomed = cluster.add_node(num_cpus=1, num_gpus=2)
        cluster.wait_for_nodes()
        break
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
        cluster.shutdown()
        if "timed out during startup" not in str(exc) or attempt == 2:
            raise
import ray  # noqa: E402

from gpusession.broker import client  # noqa: E402

ray.init(address=cluster.address)
events.set_observer_factory(lambda world_size: events.Observer())
broker = client.broker()
admin = {"token": client.admin_token_here(), "user": "admin"}
report: dict = {}


def view() -> dict:
    return client.call(broker.cluster)


def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


until(lambda: view()["gpus_total"] == 4 and view()["gpus_free"] == 4, 60, "4 free GPUs")
killed_at = time.monotonic()
cluster.remove_node(doomed, allow_graceful=False)  # SIGKILL: Ray needs ~15 s to call it dead
lost = until(lambda: (lambda v: v if v["gpus_lost"] == 2 else None)(view()), 30, "the node counted lost")
report["lost_after_s"] = time.monotonic() - killed_at
report["ray_still_lists_it"] = any(n["NodeID"] == doomed.node_id and n["Alive"] for n in ray.nodes())
report["view_when_lost"] = {k: lost[k] for k in ("gpus_total", "gpus_free", "gpus_lost", "gpus_unmanaged")}

# A 4-GPU call right after the loss: it can run only once a node comes back; until then it
# waits, never granted (Ray still lists the dead node: a grant now could not be placed).
four: dict = {}


def ask_for_four():
    try:
        where = gs.distributed(gpus=4, return_all=True)(lambda: gs.context().node_id)
        four["nodes"] = sorted(set(where()))
        four["gpu_seconds"] = where.last_run.gpu_seconds
    except Exception as exc:  # reported, and the test shows it
        four["error"] = f"{type(exc).__name__}: {exc}"


caller = threading.Thread(target=ask_for_four, daemon=True)
caller.start()
queued = until(lambda: [l for l in client.call(broker.leases, admin) if l["gpus"] == 4] or four.get("error"), 60,
               "the 4-GPU request")
report["four_first_seen"] = four["error"] if "error" in four else {k: queued[0][k] for k in ("state", "wait_kind")}
states = set()
watch_until = time.monotonic() + 2.0
while time.monotonic() < watch_until:
    states.update(l["state"] for l in client.call(broker.leases, admin) if l["gpus"] == 4)
    time.sleep(0.05)

# A 2-GPU call meanwhile: placed on the head's GPUs (the node that answers), not held back.
started = time.monotonic()
report["two_gpu_nodes"] = sorted(set(gs.distributed(gpus=2, return_all=True)(lambda: gs.context().node_id)()))
report["two_gpu_call_s"] = time.monotonic() - started
report["head"] = ray.get_runtime_context().get_node_id()
states.update(l["state"] for l in client.call(broker.leases, admin) if l["gpus"] == 4)
report["four_states_while_lost"] = sorted(states)
for attempt in range(3):  # the host is back (a new raylet); on a loaded machine it may miss Ray's window
    joining_at = time.monotonic()  # nothing can be granted on it before its processes start
    try:
        cluster.add_node(num_cpus=1, num_gpus=2)
        break
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
        if "timed out during startup" not in str(exc) or attempt == 2:
            raise
caller.join(240)
report["four"] = four
report["four_done_after_node_back_s"] = time.monotonic() - joining_at

ledger = sqlite3.connect(client.ledger_path_here())
report["billed_unplaced"] = ledger.execute(
    "select count(*) from leases where placed_at is null and gpu_seconds > 0").fetchone()[0]
report["rows"] = [dict(zip(("id", "gpus", "state", "placed", "gpu_seconds"), r)) for r in ledger.execute(
    "select id, gpus, state, placed_at is not null, gpu_seconds from leases order by id")]
report["free_after"] = ray.available_resources().get("GPU", 0.0)
ray.shutdown()
cluster.shutdown()
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
