"""Whether a live process holds a lock file: the probe behind "nobody holds the lock, so the
folder is stale" (warmdir.py's node-host folders, scratch.py's attempt folders, and the test
session's own clean-up). The kernel drops a process's flock when it dies, however it died."""
from __future__ import annotations

import enum
import fcntl
import os


class LockState(enum.Enum):
    HELD = "held"  # a live process holds a flock on it
    FREE = "free"  # it exists and nobody holds it
    MISSING = "missing"  # no such file (a folder being made, or an older version's)
    UNREADABLE = "unreadable"  # a link, not ours to open, or another error: judge it held


def lock_state(path: str) -> LockState:
    """Try an exclusive flock without waiting and let go at once; never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return LockState.MISSING
    except OSError:
        return LockState.UNREADABLE
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return LockState.HELD
    finally:
        os.close(fd)
    return LockState.FREE
