"""The Unix side of the hub (root only): the service account, the state directories with their
owners and modes, and Ray's token. Each step is idempotent: a restarted hub finds them in place."""
from __future__ import annotations

import pwd
import secrets
import subprocess
from pathlib import Path

from ..launcher import rootfs
from .plan import HubLayout


class HubSetupError(RuntimeError):
    """The hub could not prepare its account or directories; the message says what to do."""


SYSTEM_UID_MAX = 999  # Debian's SYS_UID_MAX: accounts above it are people's


def ensure_service_user(name: str, home: Path) -> pwd.struct_passwd:
    """The service account that runs Ray and the broker: a system account with no login shell.
    An existing account is used only if it is a system account other than root: a person's
    account (or root) would run every user's cluster service with its own rights."""
    try:
        found = pwd.getpwnam(name)
    except KeyError:
        found = None
    if found is not None:
        if not 0 < found.pw_uid <= SYSTEM_UID_MAX:
            raise HubSetupError(f"The service account {name!r} is uid {found.pw_uid}, not a system account "
                                f"(1-{SYSTEM_UID_MAX}): the hub will not run its cluster as a person or as root. "
                                "Name another with --service-user (it is made if missing).")
        return found
    done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HubSetupError(f"Could not create the service account {name!r} (useradd: {done.stderr.strip()}). "
                            "Create it yourself or name another with --service-user.")
    return pwd.getpwnam(name)


def prepare_directories(layout: HubLayout, account: pwd.struct_passwd) -> None:
    """STATE readable by all (0755, root); cluster/ the account's alone (0700): ledger, secrets,
    checkpoints (the account makes its own tmp/ in it); hub/ root's alone (0700); Ray's temp
    directory the account's (0700); gateway/ the account's (0755), for the gateway's socket.
    Made and checked without following a symlink (rootfs.py): a path another account put in the
    way is refused, naming it, and nothing is changed."""
    layout.state.parent.mkdir(parents=True, exist_ok=True)
    rootfs.ensure_directory(layout.state, uid=0, gid=0, mode=0o755)
    rootfs.ensure_directory(layout.hub_dir, uid=0, gid=0, mode=0o700)
    rootfs.ensure_directory(layout.cluster_dir, uid=account.pw_uid, gid=account.pw_gid, mode=0o700)
    # Ray's sockets and session files: the service account's alone (users reach the gateway only)
    rootfs.ensure_directory(layout.ray_tmp, uid=account.pw_uid, gid=account.pw_gid, mode=0o700)
    # The gateway's socket: the account makes it there, everyone may traverse to knock
    rootfs.ensure_directory(layout.gateway_dir, uid=account.pw_uid, gid=account.pw_gid, mode=0o755)


def ray_token() -> str:
    """Ray's token for this start of the hub's cluster: made anew each time and kept in memory only
    (the service's and the servers' environments), so a token seen once is useless after a restart."""
    return secrets.token_hex(32)
