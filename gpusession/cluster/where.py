"""Where this user's gpusession files are, which cluster a process would join and what this
machine has, without importing Ray (a hub kernel and its Jupyter server, the CLI, a kernel that
only lists or attaches detached runs); raycluster.py, which joins Ray, re-exports them.

    state_dir()        $GPUSESSION_HOME, else ~/.gpusession: the local head's record, the
                       default ledgers, a user's own gateway (gateway/usergateway.py)
    recorded_address() the head `gpusession cluster start` / `gpusession lab` recorded there
    target_address()   RAY_ADDRESS, else that recorded head: what raycluster.ensure_connected()
                       joins before it would start the embedded cluster
    reachable(address) whether HOST:PORT answers
    machine_gpu_count() the real GPUs, found as Ray finds them (NVML)
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from . import rayprivate

GATEWAY_ENV = "GPUSESSION_GATEWAY"  # the gateway's socket path; set in every server and kernel of a hub user

LOCAL_HEAD_FILE = "local-head.json"
LOCAL_GPUS_ENV = "GPUSESSION_LOCAL_GPUS"
DEFAULT_LOCAL_GPUS = 4
STARTUP_TIMEOUT = "timed out during startup"  # what Ray says when a new head's agents missed its start window


def state_dir() -> Path:
    """Where this user's gpusession keeps files (the local head's address, the default ledger)."""
    return Path(os.environ.get("GPUSESSION_HOME", Path.home() / ".gpusession"))


def local_head_file() -> Path:
    return state_dir() / LOCAL_HEAD_FILE


def recorded_address() -> str | None:
    """The address in the local head's record (alive or not: a caller that needs it alive asks it)."""
    try:
        address = json.loads(local_head_file().read_text()).get("address")
    except (OSError, ValueError, AttributeError):
        return None
    return address if isinstance(address, str) and address else None


def target_address() -> str | None:
    """The cluster this process would join: RAY_ADDRESS, else the recorded local head."""
    return os.environ.get("RAY_ADDRESS") or recorded_address()


def reachable(address: str, timeout: float = 0.5) -> bool:
    """Whether HOST:PORT accepts a TCP connection within `timeout` seconds."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def machine_gpu_count() -> int:
    """Real GPUs on this machine, found the way Ray finds them (NVML), without touching CUDA."""
    try:
        return rayprivate.accelerator_count("GPU")
    except Exception:  # no driver, no NVML: no GPUs
        return 0
