"""Where this machine's gpusession keeps things and what it has, without importing Ray: the state
directory, the local head's record, whether an address answers, the real GPUs. A Jupyter server
behind the gateway (a `gpusession hub` user's) and `gpusession cluster` use these and never load
Ray; raycluster.py, which joins Ray, re-exports them."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from . import rayprivate

LOCAL_GPUS_ENV = "GPUSESSION_LOCAL_GPUS"
DEFAULT_LOCAL_GPUS = 4
STARTUP_TIMEOUT = "timed out during startup"  # what Ray says when a new head's agents missed its start window


def state_dir() -> Path:
    """Where this user's gpusession keeps files (the local head's address, the default ledger)."""
    return Path(os.environ.get("GPUSESSION_HOME", Path.home() / ".gpusession"))


def local_head_file() -> Path:
    return state_dir() / "local-head.json"


def machine_gpu_count() -> int:
    """Real GPUs on this machine, found the way Ray finds them (NVML), without touching CUDA."""
    try:
        return rayprivate.accelerator_count("GPU")
    except Exception:  # no driver, no NVML: no GPUs
        return 0


def reachable(address: str, timeout: float = 0.5) -> bool:
    """Whether HOST:PORT accepts a TCP connection within `timeout` seconds."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
