"""What a cluster's processes leave in the temporary folder, and its removal by whoever ran
that cluster once it stopped (the test session, a benchmark's own cluster).

A node host keeps its warm parent's socket in `gpusession-warm-*`, and ranks keep scratch files in
`gpusession-scratch-<uid>/<Ray session>/`. A host or rank that Ray ends (the cluster stopped)
cannot remove its own; by design the next host or worker starting on the node sweeps them
(warmdir.py, scratch.py). After the last cluster nothing would: `Snapshot` notes what was there
before, and `remove_new` removes, by exact name, what appeared since once no live process holds a
lock in it (this account's folders only, never through a link).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import scratch, warmdir
from ..spec import SCRATCH_ROOT
from .lockfile import LockState, lock_state

WARM_PREFIX = warmdir.PREFIX
SCRATCH_PREFIX = f"{SCRATCH_ROOT}-"
LOCK_NAMES = (warmdir.LOCK_NAME, scratch.LOCK_NAME)  # a host's exclusive lock; a rank's shared one
UNLOCKED_GRACE_S = warmdir.UNLOCKED_GRACE_S  # a warm folder without its lock file yet may be a live host's


def found(tmp: Path) -> set[Path]:
    """The warm folders and the scratch folders' per-cluster folders under tmp (this account's)."""
    uid = os.geteuid()
    paths: set[Path] = set()
    for entry in _entries(tmp):
        if entry.name.startswith(WARM_PREFIX) and _owner(entry) == uid:
            paths.add(Path(entry.path))
        elif entry.name == f"{SCRATCH_PREFIX}{uid}" and _owner(entry) == uid:
            paths.add(Path(entry.path))
            paths.update(Path(cluster.path) for cluster in _entries(Path(entry.path)))
    return paths


@dataclass
class Snapshot:
    tmp: Path
    before: set[Path]

    @classmethod
    def now(cls, tmp: str | None = None) -> Snapshot:
        folder = Path(tmp or tempfile.gettempdir())
        return cls(folder, found(folder))

    def remove_new(self, *, timeout_s: float = 20.0) -> list[Path]:
        """Remove what appeared since the snapshot, each once no lock in it is held (waiting up to
        timeout_s for processes the cluster's stop is still ending); returns what is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = []
            for path in sorted(found(self.tmp) - self.before, key=lambda p: -len(p.parts)):  # inner first
                if _held(path) or _warm_being_made(path):
                    left.append(path)
                elif path.name.startswith(SCRATCH_PREFIX):
                    _rmdir_if_empty(path)  # the scratch root: only once its cluster folders are gone
                else:
                    shutil.rmtree(path, ignore_errors=True)
            if not left or time.monotonic() > deadline:
                return [path for path in left if path.exists()]
            time.sleep(0.2)


def _held(folder: Path) -> bool:
    """Whether a live process holds a lock file in folder or below it (links not followed)."""
    for root, dirs, files in os.walk(folder):
        for name in files:
            if name in LOCK_NAMES and _locked(os.path.join(root, name)):
                return True
    return False


def _warm_being_made(path: Path) -> bool:
    """A warm folder with no lock file yet (mkdtemp, then the lock): a host's, unless it is old."""
    try:
        return (path.name.startswith(WARM_PREFIX) and not (path / warmdir.LOCK_NAME).exists()
                and time.time() - path.stat().st_mtime < UNLOCKED_GRACE_S)
    except OSError:
        return False


def _locked(path: str) -> bool:
    return lock_state(path) is LockState.HELD  # gone, or a link: nobody's lock


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        return [entry for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _owner(entry: os.DirEntry) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return None


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
