"""In a child the launcher just forked, still root: become the user, for good.

Order matters: supplementary groups, then the primary gid, then the uid (after setuid nothing
else can be changed); then a check that root cannot be regained. The environment is rebuilt
from nothing but the launcher's own clean one (it holds no secret) and the user's names; every
descriptor but the rank's own channel is closed.
"""
from __future__ import annotations

import os

from .policy import Account

PRIVATE_UMASK = 0o077


class DropFailed(RuntimeError):
    """The child could not become the user; it exits without running anything."""


def become(account: Account, *, keep_fd: int, tmpdir: str) -> None:
    os.initgroups(account.pw_name, account.pw_gid)  # supplementary groups from /etc/group (and NSS)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)  # real, effective and saved uid: no way back
    _verify(account)
    close_other_descriptors(keep_fd)
    os.umask(PRIVATE_UMASK)
    keep = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL") if key in os.environ}
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update({"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name,
                       "TMPDIR": tmpdir})
    import tempfile

    tempfile.tempdir = None  # the launcher's cached one is not the user's
    try:  # the rank goes to the caller's folder later, when its user may enter it (run/rank/child.py)
        os.chdir(account.pw_dir)
    except OSError:
        os.chdir("/")


def _verify(account: Account) -> None:
    if os.getresuid() != (account.pw_uid,) * 3 or os.getresgid() != (account.pw_gid,) * 3:
        raise DropFailed(f"still uid {os.getresuid()} gid {os.getresgid()}, not {account.pw_name}'s")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise DropFailed(f"the child of {account.pw_name!r} could regain root")


def close_other_descriptors(keep_fd: int) -> None:
    """Every descriptor the launcher had (its listener, other connections, its log) goes."""
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, _max_fd())


def _max_fd() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")
