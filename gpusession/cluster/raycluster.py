"""Connect to Ray: reuse the process's connection, else RAY_ADDRESS, else a local head started by
`gpusession cluster start`, else start the embedded default (a Ray head inside this process with
the machine's GPUs, or logical GPUs when it has none)."""
from __future__ import annotations

import json
import logging
import os
import sys
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import ray

from . import rayprivate
from .unreserved import consistent_unreserved
from .where import (  # noqa: F401 - re-exported: where things are, known without Ray
    DEFAULT_LOCAL_GPUS, LOCAL_GPUS_ENV, STARTUP_TIMEOUT, local_head_file, machine_gpu_count, state_dir,
)
from .where import reachable as _reachable
from ..errors import GPUSessionError
from ..observe.events import _in_notebook_kernel

log = logging.getLogger("gpusession")

HEAD_RESOURCE = "node:__internal_head__"
# A node started with this custom resource offers its GPUs as logical even on a machine with real
# ones (`ray start --resources='{"gpusession_logical_gpus": 1}'`): its ranks train on the CPU.
LOGICAL_GPUS_RESOURCE = "gpusession_logical_gpus"
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id (bundle label selectors)
_connect_lock = threading.Lock()


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    gpus: float
    is_head: bool
    logical: bool  # GPU resource declared with no real accelerator behind it
    raylet_port: int = 0  # the node's raylet (NodeManagerPort): the broker's liveness probe connects to it


def _recorded_head() -> dict | None:
    try:
        record = json.loads(local_head_file().read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and _reachable(record.get("address", "")) else None


def recorded_local_head() -> str | None:
    """The address written by `gpusession cluster start`, if that head still answers."""
    record = _recorded_head()
    return record["address"] if record else None


def _ray_token_available() -> bool:
    home_token = Path.home() / ".ray" / "auth_token"
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or home_token.exists())


def _auth_mode_for(address: str, record: dict | None) -> str | None:
    """Ray turns token authentication on by itself only for address=None/"auto"; a client of an
    explicit address must say so, or Ray refuses it ("Authentication token is missing")."""
    if os.environ.get("RAY_AUTH_MODE"):
        return None  # the user decided
    if record and record.get("address") == address:
        return record.get("auth_mode") or "token"
    return "token" if _ray_token_available() else None


def ensure_connected(*, local_gpus: int | None = None) -> None:
    """Connect this process to Ray once; see the module docstring for the order."""
    if ray.is_initialized():
        return
    with _connect_lock:
        if ray.is_initialized():
            return
        _connect(local_gpus)
        if _in_notebook_kernel():  # Ray's notes about its own processes go to the server's log, not a cell
            rayprivate.send_cluster_messages_to(_to_server_log)


def _to_server_log(text: str) -> None:
    # the kernel's own stderr (not the cell's): Jupyter writes it to the server's log
    print(f"gpusession: from Ray: {text}", file=sys.__stderr__, flush=True)


def _connect(local_gpus: int | None) -> None:
    record = _recorded_head()
    address = os.environ.get("RAY_ADDRESS") or (record or {}).get("address")
    if address:
        mode = _auth_mode_for(address, record)
        if mode:
            _use_auth_mode(mode)
        log.info("Connecting to the Ray cluster at %s", address)
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        return
    behind = gateway_refusal(os.environ)
    if behind:
        raise GPUSessionError(behind)
    start_embedded(local_gpus=local_gpus)


def gateway_refusal(env) -> str | None:
    """PURE: why a process behind the gateway (a `gpusession hub` user's kernel) must not start a
    Ray cluster of its own when it finds none; None elsewhere."""
    from .where import GATEWAY_ENV

    path = env.get(GATEWAY_ENV)
    if not path:
        return None
    return (f"This process reaches gpusession through the gateway at {path} ({GATEWAY_ENV}), not through Ray: "
            "it holds no Ray address and starts no Ray cluster of its own. This call has no route through the "
            "gateway in this gpusession yet; ask your hub's admin which version brings it.")


def _use_auth_mode(mode: str) -> None:
    """Set RAY_AUTH_MODE for this process; Ray read its config at import, so refresh it the way
    Ray itself does when it turns token authentication on."""
    os.environ["RAY_AUTH_MODE"] = mode
    try:
        rayprivate.refresh_auth_config()
    except Exception:  # another Ray: it reads the variable at ray.init
        pass


def start_embedded(*, local_gpus: int | None = None) -> None:
    real = machine_gpu_count()
    if real:
        gpus = real
    else:
        gpus = int(local_gpus or os.environ.get(LOCAL_GPUS_ENV) or DEFAULT_LOCAL_GPUS)
        log.warning(
            "No GPU on this machine: starting a local Ray head with %d logical GPUs "
            "(workers train on the CPU with gloo).",
            gpus,
        )
    init_local_head(num_gpus=gpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)



def init_local_head(*, attempts: int = 3, **init_options) -> None:
    """`ray.init(address="local", ...)`, tried again when the new head's agents missed Ray's fixed
    30 s start window (a loaded machine); any other failure is raised at once."""
    for attempt in range(attempts):
        try:
            ray.init(address="local", **init_options)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if STARTUP_TIMEOUT not in str(exc) or attempt == attempts - 1:
                raise
            log.warning("The local Ray head timed out during startup (a loaded machine?); trying again.")
            ray.shutdown()


def nodes() -> list[NodeInfo]:
    """Alive nodes with their GPU totals, as Ray declares them."""
    return [node_info(node) for node in ray.nodes() if node.get("Alive")]


def node_info(node: dict) -> NodeInfo:
    """PURE: one entry of ray.nodes() as gpusession sees it. Its GPUs are logical (ranks train on
    the CPU with gloo) when no real accelerator is behind them, or when the node was started with
    the LOGICAL_GPUS_RESOURCE (a GPU machine that should act as a CPU one, as the test suite's
    session cluster does, whatever number of real GPUs the machine has)."""
    resources = node.get("Resources", {})
    gpus = float(resources.get("GPU", 0.0))
    real = any(key.startswith("accelerator_type:") for key in resources) and LOGICAL_GPUS_RESOURCE not in resources
    return NodeInfo(node_id=node["NodeID"], address=node.get("NodeManagerAddress", ""), gpus=gpus,
                    is_head=HEAD_RESOURCE in resources, logical=gpus > 0 and not real,
                    raylet_port=int(node.get("NodeManagerPort") or 0))


def node_answers(node_id: str, timeout_s: float) -> bool:
    """Is the node still there: Ray counts it alive and its raylet accepts a connection now? A
    host that died refuses at once; one that went silent does not answer within timeout_s."""
    from .liveness import unreachable

    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            if not node.get("Alive"):
                return False
            target = (node.get("NodeManagerAddress") or "", int(node.get("NodeManagerPort") or 0))
            return target[1] > 0 and not unreachable({node_id: target}, timeout_s=timeout_s)
    return False


def head_node_id() -> str:
    for node in nodes():
        if node.is_head:
            return node.node_id
    raise RuntimeError("The Ray cluster reports no head node.")


def available_gpus_by_node() -> dict[str, float]:
    """Ray's own view of free GPUs per node (what a new placement group could take)."""
    return {
        node_id: float(resources.get("GPU", 0.0))
        for node_id, resources in rayprivate.available_resources_per_node().items()
    }


def unreserved_gpus_by_node(*, excluding_group: str) -> dict[str, float]:
    """Per node: free GPUs plus GPUs held by placement groups other than `excluding_group`.

    Ray drops a removed group's keys from its view before it adds the GPUs back, so "our
    group's keys are gone" does not mean "free". This sum grows by exactly our GPUs when ours
    are back, whatever other groups do meanwhile (read consistently: unreserved.py)."""
    return consistent_unreserved(rayprivate.total_resources_per_node, rayprivate.available_resources_per_node,
                                 excluding_group=excluding_group)


def dead_job_ids(job_ids: set[str]) -> set[str]:
    """Those of these Ray job ids (hex) whose driver is gone, from the GCS job table (private API:
    Ray has no public one without the dashboard)."""
    return {row["JobID"] for row in rayprivate.jobs() if row["JobID"] in job_ids and row["IsDead"]}
