"""Scratch directories on a node: made by the worker actor before a rank starts, removed when
the last rank of the attempt on this node ends, whatever way it ended.

Each rank's actor holds a shared flock on `<dir>/.lock` while its rank runs. The kernel drops
the lock when the holder dies (the actor killed, its host lost), so "nobody holds the lock" is
what makes a directory stale, for every cluster sharing this filesystem: a worker actor starting
on a node removes those (`remove_stale`). No Ray, no clock but file times.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time

from .lockfile import LockState, lock_state

LOCK_NAME = ".lock"
UNLOCKED_GRACE_S = 60.0
CLUSTER_PREFIXES = ("session_", "no-cluster")  # Ray session names (spec.lease_scratch_dir)  # a directory with no lock file yet may be just being made


class Claim:
    """One rank's hold on its attempt's scratch directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        for tries_left in (2, 1, 0):  # a stale sweep may remove an empty parent under makedirs
            try:
                os.makedirs(path, exist_ok=True)
                self._fd = _open_locked(os.path.join(path, LOCK_NAME))
                break
            except FileNotFoundError:
                if not tries_left:
                    raise

    def release(self) -> bool:
        """Let go; the last rank out removes the directory. True if this one removed it."""
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # gets it only if no other rank holds it
        except OSError:
            return False
        else:
            shutil.rmtree(self.path, ignore_errors=True)
            _rmdir_if_empty(os.path.dirname(self.path))  # the lease's folder, once its last attempt here is gone
            return True
        finally:
            os.close(self._fd)
            self._fd = None


def _open_locked(lock: str) -> int:
    """The lock file appears already locked (made under a private name, locked, then linked into
    place), so a sweep never finds it free while its first rank is still taking it."""
    private = f"{lock}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(private, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.link(private, lock)
    except FileExistsError:  # another rank of the attempt on this node made it: share theirs
        os.close(fd)
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.unlink(private)
    return fd


def remove_lease(path: str) -> None:
    """The lease ended: its directory on this node goes, with every attempt's."""
    shutil.rmtree(path, ignore_errors=True)
    _rmdir_if_empty(os.path.dirname(path))


def remove_stale(root: str, *, now: float | None = None) -> list[str]:
    """Remove every attempt directory under root/<cluster>/<lease>/ that no live rank holds,
    then the lease and cluster directories left empty. Returns the attempt directories removed."""
    now = time.time() if now is None else now
    removed = []
    for cluster in _subdirs(root):
        if not os.path.basename(cluster).startswith(CLUSTER_PREFIXES):
            continue  # not laid out by this code (an older version's lease-N): not ours to judge
        for lease in _subdirs(cluster):
            emptied = False
            for attempt in _subdirs(lease):
                if _stale(attempt, now):
                    shutil.rmtree(attempt, ignore_errors=True)
                    removed.append(attempt)
                    emptied = True
            if emptied or now - _mtime(lease) > UNLOCKED_GRACE_S:  # (Claim retries if it loses this race)
                _rmdir_if_empty(lease)
        _rmdir_if_empty(cluster)
    return removed


def _stale(path: str, now: float) -> bool:
    state = lock_state(os.path.join(path, LOCK_NAME))
    if state is LockState.MISSING:  # made before its lock: stale only once it has been so a while
        return now - _mtime(path) > UNLOCKED_GRACE_S
    return state is LockState.FREE  # held: a live rank holds it


def _subdirs(path: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _rmdir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
