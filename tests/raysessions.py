"""Ray's session folders that a test session's clusters made, and their removal at its end.

Every Ray cluster writes a folder `session_<date>_<time>_<pid>` in Ray's temporary folder
(`$RAY_TMPDIR/ray`, else `$TMPDIR/ray`, else `/tmp/ray`): its logs, sockets and runtime files,
some megabytes each. Ray leaves it when the cluster stops, for reading after the fact, so a
suite that starts dozens of clusters left dozens behind on every run. `Snapshot` notes the
folders there before the session; `remove_ended` removes, by exact name, each that appeared
since and that no process has a file open in any more (a live cluster's processes keep their
log files open; links are never followed), and Ray's `session_latest` link when it named one of
them. The test session keeps them when a test failed: their logs are what tells why.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "session_"
LATEST = "session_latest"  # Ray's link to the newest session's folder


def ray_temp_root(env=os.environ) -> Path:
    """Where Ray puts its session folders on Linux (ray._common.utils.get_default_ray_temp_dir)."""
    return Path(env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp") / "ray"


def session_folders(root: Path) -> set[Path]:
    """This account's session folders under root (real folders, not links)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return set()
    uid = os.geteuid()
    found = set()
    for entry in entries:
        try:
            if (entry.name.startswith(PREFIX) and entry.name != LATEST and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == uid):
                found.add(Path(entry.path))
        except OSError:
            continue
    return found


def open_paths(proc: Path = Path("/proc")) -> set[str]:
    """Every path another process on this machine has open (what this account may read of
    /proc). This one's are left out: a driver keeps its core worker's log files open in its
    cluster's folder after ray.shutdown(), while a live cluster's own processes (its GCS and
    raylets, never in the driver) keep theirs open as long as they run."""
    paths = set()
    try:
        pids = os.listdir(proc)
    except OSError:  # no /proc: nothing is known to be open, so nothing counts as in use
        return paths
    me = str(os.getpid())
    for pid in pids:
        if not pid.isdigit() or pid == me:
            continue
        folder = proc / pid / "fd"
        try:
            descriptors = os.listdir(folder)
        except OSError:
            continue
        for fd in descriptors:
            try:
                paths.add(os.readlink(folder / fd))
            except OSError:
                continue
    return paths


def in_use(folder: Path, opened: set[str]) -> bool:
    """PURE: whether any of the open paths lies in folder."""
    inside = f"{folder}{os.sep}"
    return any(path == str(folder) or path.startswith(inside) for path in opened)


@dataclass
class Snapshot:
    root: Path
    before: set[Path]

    @classmethod
    def now(cls, env=os.environ) -> Snapshot:
        root = ray_temp_root(env)
        return cls(root, session_folders(root))

    def new(self) -> list[Path]:
        """The session folders that appeared since the snapshot, oldest first."""
        return sorted(session_folders(self.root) - self.before)

    def remove_ended(self, *, timeout_s: float = 0.0) -> list[Path]:
        """Remove the new folders no process has a file open in, waiting up to timeout_s for the
        processes of clusters just stopped to end (a head's own processes outlive its driver's
        ray.shutdown() by a moment); returns the ones left (in use)."""
        deadline = time.monotonic() + timeout_s
        removed: set[Path] = set()
        while True:
            opened = open_paths()
            left = []
            for folder in self.new():
                if in_use(folder, opened):
                    left.append(folder)
                    continue
                shutil.rmtree(folder, ignore_errors=True)
                removed.add(folder)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        latest = self.root / LATEST
        try:
            if latest.is_symlink() and Path(os.readlink(latest)) in removed:
                latest.unlink()
        except OSError:
            pass
        return left
