"""Where a cluster's broker keeps its state (ledger.db, admin_token, identity_key): one directory
per cluster, on its head node, so two clusters whose users share a home never share a ledger.

Under $GPUSESSION_HOME (~/.gpusession), the broker of a cluster whose head is host H takes the
first directory of `candidates` that no running broker holds: clusters/H, then clusters/H-PORT
(a second head on the same host, PORT its GCS port). It holds that directory with a lock on
broker.lock for as long as it runs (released by the OS when its process dies), and records the
choice in the cluster's own Ray key-value store, so a restarted broker of the same cluster comes
back to the same directory and a client on the head finds the admin token there. A new head on
the same host (`gpusession cluster start` again) gets clusters/H again: its ledger, quotas and
usage carry on.

Existing users: a ledger from before this layout (~/.gpusession/ledger.db and its two secrets)
stays where it is and belongs to the first host whose broker starts after the upgrade (the host
is written to ledger.db.owner beside it); brokers of other hosts never use it.
An explicit db_path (config or $GPUSESSION_DB_PATH) is used as given, as before, and recorded
in the cluster's key-value store too: a broker started later on the same cluster without one (a
kernel's client re-creating a broker that was killed for good, e.g. in the moment between an
admin's replacement killing the old one and starting the new) opens that same ledger. Before, it
took this directory layout's ledger instead: the leases of the running calls were unknown there
(their next `watch` failed with LeaseNotFound), and the policy the first broker was started with
(the hub's and a Jupyter server's `require_signed_identity`, quotas) was not in force.
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path

from ...cluster.raycluster import state_dir

KV_KEY = b"gpusession-state-dir"
KV_NAMESPACE = "gpusession"
KV_LEDGER_KEY = b"gpusession-explicit-ledger"  # the ledger path a broker was started with, if one was given
LOCK_NAME = "broker.lock"
LEGACY_LEDGER = "ledger.db"
LEGACY_OWNER = "ledger.db.owner"
RESTART_WAIT_S = 30.0  # a restarted broker waits this long for its predecessor's process to exit


class StateDirTaken(RuntimeError):
    """The directory this cluster's broker used is held by a broker that is still running."""


def host_key(hostname: str) -> str:
    """A host name as a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", hostname)[:128].lstrip(".") or "host"  # never "." or ".."


def candidates(home: Path, *, host: str, port: int, legacy_owner: str | None,
               legacy_exists: bool) -> list[Path]:
    """PURE: the directories a new broker of the cluster headed at host:port may take, in order."""
    found = []
    if legacy_exists and legacy_owner in (None, host):
        found.append(home)
    return found + [home / "clusters" / host, home / "clusters" / f"{host}-{port}"]


def relative(home: Path, directory: Path) -> str:
    return os.path.relpath(directory, home)


class Claim:
    """A state directory this process holds (the lock lives as long as this object's file)."""

    def __init__(self, directory: Path, lock) -> None:
        self.directory, self._lock = directory, lock

    @property
    def db_path(self) -> str:
        return str(self.directory / LEGACY_LEDGER)

    def release(self) -> None:
        self._lock.close()


def try_lock(directory: Path) -> Claim | None:
    """Hold `directory` unless another broker holds it (flock: per open file, also over NFS)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = open(directory / LOCK_NAME, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return Claim(directory, lock)


def claim(home: Path, *, host: str, port: int, recorded: str | None,
          wait_s: float = RESTART_WAIT_S) -> Claim:
    """The directory for this cluster's broker: the one recorded for the cluster (waiting for a
    predecessor that is still exiting), else the first free candidate."""
    if recorded is not None:
        directory = (home / recorded).resolve()
        deadline = time.monotonic() + wait_s
        while True:
            held = try_lock(directory)
            if held is not None:
                return held
            if time.monotonic() > deadline:
                raise StateDirTaken(f"This cluster's broker state is still held by another broker after "
                                    f"{wait_s:.0f} s; stop it first.")
            time.sleep(0.1)
    owner_file = home / LEGACY_OWNER
    owner = owner_file.read_text().strip() if owner_file.exists() else None
    for directory in candidates(home, host=host, port=port, legacy_owner=owner,
                                legacy_exists=(home / LEGACY_LEDGER).exists()):
        held = try_lock(directory)
        if held is None:
            continue
        if directory == home and owner is None:
            owner_file.write_text(host + "\n")
        return held
    raise StateDirTaken(f"Every state directory for host {host} port {port} is held by another broker.")


# ----- with Ray: the broker chooses and records, a client reads the record --------------------------
def _this_cluster() -> tuple[str, int]:
    import ray

    port = int(ray.get_runtime_context().gcs_address.rpartition(":")[2])
    return host_key(socket.gethostname()), port


def claim_for_this_cluster() -> Claim:
    """Called by the broker (on the head node): claim and record this cluster's directory."""
    from ...cluster import rayprivate

    home = state_dir()
    recorded = rayprivate.kv_get(KV_KEY, namespace=KV_NAMESPACE)
    host, port = _this_cluster()
    held = claim(home, host=host, port=port, recorded=recorded.decode() if recorded else None)
    rayprivate.kv_put(KV_KEY, relative(home, held.directory).encode(), namespace=KV_NAMESPACE)
    return held


def recorded_here() -> Path | None:
    """For a client on the head node: this cluster's state directory, if its broker recorded one
    (None before the first broker started, or when it uses an explicit db_path)."""
    from ...cluster import rayprivate

    recorded = rayprivate.kv_get(KV_KEY, namespace=KV_NAMESPACE)
    return (state_dir() / recorded.decode()).resolve() if recorded else None


def record_explicit_ledger(db_path: str) -> str:
    """Called by a broker started with an explicit ledger path (on the head node): record it as
    this cluster's ledger; returns the path as recorded (absolute)."""
    from ...cluster import rayprivate

    path = os.path.abspath(db_path)
    rayprivate.kv_put(KV_LEDGER_KEY, path.encode(), namespace=KV_NAMESPACE)
    return path


def recorded_explicit_ledger() -> str | None:
    """The ledger path a broker of this cluster was started with, if one was (None: the
    directory layout above decides)."""
    from ...cluster import rayprivate

    recorded = rayprivate.kv_get(KV_LEDGER_KEY, namespace=KV_NAMESPACE)
    return recorded.decode() if recorded else None
