"""Where the broker's read-only status endpoint is: the announcement file both sides share.

The broker (broker/http/status_http.py) serves `gs.status()` over HTTP on the head's loopback, so
`gpusession status` on the head answers without importing Ray (Ray's import alone is over a
second). It announces the endpoint beside its ledger, in the cluster's private state directory
(mode 0700; this file 0600, like the admin token there):
`status-endpoint.json` = {"url", "token", "ray_address", "host", "pid"}.
The token proves the caller could read that directory (the head's gpusession user); the broker
still checks the identity it is sent exactly as on the Ray path (authz.caller), so a user sees
only their own runs and a cluster that requires signed identities still requires them.

This module imports no Ray: the CLI reads the file with it, the broker writes it.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ANNOUNCE_NAME = "status-endpoint.json"
DB_PATH_ENV = "GPUSESSION_DB_PATH"


@dataclass(frozen=True)
class Endpoint:
    url: str  # http://127.0.0.1:PORT/status
    token: str  # a secret the broker made at start; sent as "Authorization: token ..."
    ray_address: str  # the GCS address of the cluster whose broker serves it
    host: str  # the head's host name: loopback means nothing on another machine
    pid: int  # the broker's process (a file left by a broker that died is ignored)


def announcement_path(db_path: str | Path) -> Path:
    return Path(db_path).with_name(ANNOUNCE_NAME)


def write(path: Path, endpoint: Endpoint) -> None:
    """Replace the announcement at once (never half-written), readable by its owner only."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".status-endpoint-")  # mode 0600
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(endpoint), out)
    os.replace(temporary, path)


def remove(path: Path, endpoint: Endpoint) -> None:
    """Remove the announcement if it is still this endpoint's (a successor may have replaced it)."""
    if read(path) == endpoint:
        path.unlink(missing_ok=True)


def read(path: Path) -> Endpoint | None:
    try:
        return Endpoint(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def places(home: Path, db_path_env: str | None) -> list[Path]:
    """Where a broker of this user may have announced: beside $GPUSESSION_DB_PATH, in
    GPUSESSION_HOME (an explicit ledger there, or one from before per-cluster directories), and
    in each cluster directory under it (broker/storage/statedir.py)."""
    found = [announcement_path(db_path_env)] if db_path_env else []
    found.append(home / ANNOUNCE_NAME)
    try:
        found += sorted(directory / ANNOUNCE_NAME for directory in (home / "clusters").iterdir())
    except OSError:
        pass
    return found


def find(address: str | None, *, home: Path) -> Endpoint | None:
    """The live endpoint of the broker of the cluster at `address` on this host, if announced."""
    if not address:
        return None
    here = socket.gethostname()
    for path in places(home, os.environ.get(DB_PATH_ENV)):
        endpoint = read(path)
        if endpoint and endpoint.ray_address == address and endpoint.host == here and _alive(endpoint.pid):
            return endpoint
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False
