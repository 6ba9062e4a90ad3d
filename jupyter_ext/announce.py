"""The file that tells this user's `gpusession` CLI where a gpusession server runs, so `gpusession
status`, `leases` and `quota` answer through its REST API in well under a second instead of
joining Ray (see gpusession.cli.access, which reads it). Written privately in Jupyter's runtime directory, like
Jupyter's own jpserver-<pid>.json (which holds the same token); removed at shutdown."""
from __future__ import annotations

import json
import os
from pathlib import Path

from jupyter_core.paths import secure_write

ANNOUNCE_PREFIX = "gpusession-"


def runtime_dir() -> Path:
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def announce_path(pid: int | None = None) -> Path:
    return runtime_dir() / f"{ANNOUNCE_PREFIX}{pid or os.getpid()}.json"


def write(serverapp, ray_address: str) -> None:
    record = {"url": serverapp.connection_url, "token": serverapp.identity_provider.token,
              "ray_address": ray_address, "pid": os.getpid()}
    path = announce_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with secure_write(str(path)) as out:
        json.dump(record, out)


def remove() -> None:
    announce_path().unlink(missing_ok=True)
