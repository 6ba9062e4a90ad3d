"""Every private Ray API gpusession uses, and nothing else: the one place to look when Ray moves.

Ray exposes no public way to read free resources per node without its dashboard, to find the
node's IP the way Ray itself picks it, to count accelerators without touching CUDA, to refresh
its auth config after setting RAY_AUTH_MODE, to upload a local package for a detached actor, or
to keep a small record in the cluster's own key-value store (where the broker's state lives).
The versions these calls are tested with are the range pinned in pyproject.toml (`ray[default]`);
tests/integration/test_rayprivate.py calls each one against the installed Ray so a change shows up as
one failing test naming the call, not as a broker that cannot read the cluster."""
from __future__ import annotations

import logging
from typing import Any


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Node id -> free resources, as the GCS reports them now (needs a connected driver)."""
    from ray._private import state

    return state.available_resources_per_node()


def total_resources_per_node() -> dict[str, dict[str, float]]:
    from ray._private import state

    return state.total_resources_per_node()


def jobs() -> list[dict[str, Any]]:
    """Ray's job table (ended jobs carry an end time): how the broker finds dead drivers."""
    from ray._private import state

    return state.jobs()


def node_ip_address() -> str:
    """This machine's address as Ray would advertise it."""
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


def accelerator_count(resource: str = "GPU") -> int:
    """Real accelerators on this machine, found the way Ray finds them (NVML), without CUDA."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    return int(get_accelerator_manager_for_resource(resource).get_current_node_num_accelerators())


def refresh_auth_config() -> None:
    """Ray reads RAY_AUTH_MODE at import; re-read it the way Ray does when token auth turns on."""
    from ray._private.authentication.authentication_token_setup import Config

    Config.initialize("")


def upload_package(path: str, log: logging.Logger) -> dict:
    """Upload a local package to the GCS and return the runtime env naming it (py_modules)."""
    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    scratch = ray._private.worker.global_worker.node.get_runtime_env_dir_path()
    return upload_py_modules_if_needed({"py_modules": [path], "excludes": ["__pycache__"]},
                                       include_gitignore=False, scratch_dir=scratch, logger=log)


def session_dir() -> str:
    """The connected Ray session's directory (logs, sockets) on this node."""
    import ray

    return ray._private.worker.global_worker.node.get_session_dir_path()


def head_started_here() -> bool:
    """Whether this connected process started its cluster's head itself (`ray.init()` with no
    cluster to join: the embedded cluster), so the cluster ends when this process does."""
    import ray

    node = ray._private.worker._global_node
    return bool(node is not None and node.head)


def kv_get(key: str, *, namespace: str) -> bytes | None:
    """A value of the cluster's key-value store (kept by the GCS; gone with the cluster)."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(key, namespace=namespace)


def kv_put(key: str, value: bytes, *, namespace: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=namespace)


def send_cluster_messages_to(write) -> None:
    """Ray's driver prints the cluster's messages about its own processes ("(raylet) WARNING: 8
    PYTHON worker processes have been started ...") with `print_to_stdstream` from a listener
    thread, whatever log_to_driver says; in a kernel they land in whichever cell runs. From now
    on that listener calls `write(text)` instead (workers' own output is not affected: it goes
    through another handler)."""
    from ray._private import worker

    def to_log(data: dict, ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            write(f"({data.get('pid', 'ray')}) {line}")

    worker.print_to_stdstream = to_log
