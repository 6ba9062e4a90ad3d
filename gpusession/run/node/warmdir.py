"""The node host's private folder for its warm parent's socket (`gpusession-warm-*` under the
temporary folder), and the sweep of those a host left behind.

A host that stops by itself removes its folder; one that Ray ends (the cluster stopped, the node
lost, the actor killed) cannot. So the folder holds a lock file that its host keeps an exclusive
flock on while it lives: the kernel drops the lock when the host's process dies, and "nobody
holds the lock" is what makes a folder stale. A host starting on a node removes the stale folders
of its own account (`sweep`), never another account's, never through a symbolic link. No Ray.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from .lockfile import LockState, lock_state

PREFIX = "gpusession-warm-"
SOCKET_NAME = "zygote.sock"
LOCK_NAME = ".held"
# A folder with no lock file may be a host's that is just being made (mkdtemp, then the lock):
# stale only once it has been so this long. Folders of older versions have no lock file at all.
UNLOCKED_GRACE_S = 60.0


@dataclass
class WarmDir:
    """A live host's folder: the socket's path in it, and the held lock (closed with the process)."""

    path: str
    lock_fd: int

    @property
    def socket_path(self) -> str:
        return os.path.join(self.path, SOCKET_NAME)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock_fd)


def make(parent: str | None = None) -> WarmDir:
    """A new folder (mode 0700: only this account may connect to the socket), locked."""
    path = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder just made: nobody else holds it
    return WarmDir(path, fd)


def sweep(parent: str | None = None, *, uid: int | None = None, now: float | None = None) -> list[str]:
    """Remove the folders under PARENT (the temporary folder) that belong to UID (this process's)
    and that no live host holds; returns those removed."""
    parent = tempfile.gettempdir() if parent is None else parent
    uid = os.geteuid() if uid is None else uid
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            found = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or found.st_uid != uid:
            continue  # a link, a file, another account's: not this host's to judge
        if _stale(entry.path, found.st_mtime, now):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _stale(path: str, mtime: float, now: float) -> bool:
    state = lock_state(os.path.join(path, LOCK_NAME))
    if state is LockState.MISSING:
        return now - mtime > UNLOCKED_GRACE_S
    return state is LockState.FREE  # held: its host lives; unreadable: not ours to judge
