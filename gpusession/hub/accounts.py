"""The Unix side of the hub (root only): the service account, the state directories with their
owners and modes, and Ray's token. Each step is idempotent: a restarted hub finds them in place."""
from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from pathlib import Path

from .plan import HubLayout


class HubSetupError(RuntimeError):
    """The hub could not prepare its account or directories; the message says what to do."""


def ensure_service_user(name: str, home: Path) -> pwd.struct_passwd:
    """The service account that runs Ray and the broker: a system account with no login shell."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HubSetupError(f"Could not create the service account {name!r} (useradd: {done.stderr.strip()}). "
                            "Create it yourself or name another with --service-user.")
    return pwd.getpwnam(name)


def prepare_directories(layout: HubLayout, account: pwd.struct_passwd) -> None:
    """STATE readable by all (0755, root); cluster/ and the Ray temp dir the account's alone
    (0700): ledger, secrets, checkpoints and Ray's sessions; hub/ root's alone (0700)."""
    _directory(layout.state, 0, 0, 0o755)
    _directory(layout.hub_dir, 0, 0, 0o700)
    _directory(layout.cluster_dir, account.pw_uid, account.pw_gid, 0o700)
    _directory(layout.cluster_dir / "tmp", account.pw_uid, account.pw_gid, 0o700)
    # Users' kernels are Ray drivers on this machine: they reach the raylet's sockets and write
    # their logs in the session directory below (Ray makes its own directories there for all).
    _directory(layout.ray_tmp, account.pw_uid, account.pw_gid, 0o711)


def ray_token(layout: HubLayout) -> str:
    """Ray's token for this hub's cluster (kept in hub/, made once, as Ray itself makes one)."""
    path = layout.ray_token_path
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        return value


def _directory(path: Path, uid: int, gid: int, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
