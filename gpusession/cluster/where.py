"""Where this user's gpusession files are and which cluster a process would join, without
importing Ray (a hub kernel, the CLI, a kernel that only lists or attaches detached runs).

    state_dir()        $GPUSESSION_HOME, else ~/.gpusession: the local head's record, the
                       default ledgers, a user's own gateway (gateway/usergateway.py)
    recorded_address() the head `gpusession cluster start` / `gpusession lab` recorded there
    target_address()   RAY_ADDRESS, else that recorded head: what raycluster.ensure_connected()
                       joins before it would start the embedded cluster
"""
from __future__ import annotations

import json
import os
from pathlib import Path

LOCAL_HEAD_FILE = "local-head.json"


def state_dir() -> Path:
    """Where this user's gpusession keeps files (the local head's address, the default ledger)."""
    return Path(os.environ.get("GPUSESSION_HOME", Path.home() / ".gpusession"))


def recorded_address() -> str | None:
    """The address in the local head's record (alive or not: a caller that needs it alive asks it)."""
    try:
        address = json.loads((state_dir() / LOCAL_HEAD_FILE).read_text()).get("address")
    except (OSError, ValueError, AttributeError):
        return None
    return address if isinstance(address, str) and address else None


def target_address() -> str | None:
    """The cluster this process would join: RAY_ADDRESS, else the recorded local head."""
    return os.environ.get("RAY_ADDRESS") or recorded_address()
