"""One cgroup per rank, made by the launcher as root: the rank's child joins it before it drops
to its user, so everything the rank starts (a double-forked, setsid daemon too) is in it and is
killed when the rank's attempt ends. Where the cgroup v1 devices controller is writable, the
rank's cgroup also denies the GPU device files of the node that are not its own (as Slurm's
ConstrainDevices).

Which hierarchy (found in /proc/self/mounts):
- cgroup2 (`/sys/fs/cgroup` or the hybrid `/sys/fs/cgroup/unified`) with `cgroup.kill`
  (Linux 5.14+): the kernel kills every member at once;
- else the v1 freezer: freeze, kill every member, thaw;
- else none: `Tracker` returns None and the launcher falls back to being a subreaper (gate.py).
Devices: v1 `devices` only (cgroup2 needs a BPF program for that, which this does not load).
"""
from __future__ import annotations

import os
import re
import signal
import time

NVIDIA_MAJOR = 195
NVIDIA_DEVICE = re.compile(r"^nvidia(\d+)$")
EMPTY_WAIT_S = 5.0


def device_denials(present: list[str], allowed: tuple[str, ...] | None) -> list[str]:
    """PURE: the devices.deny lines that hide every /dev/nvidiaN of `present` (names in /dev)
    whose N is not one of `allowed` (the rank's GPU indices); none when allowed is None
    (logical GPUs, or ids that are not indices: nothing is constrained)."""
    if allowed is None:
        return []
    mine = set(allowed)
    lines = []
    for name in sorted(present):
        found = NVIDIA_DEVICE.match(name)
        if found and found.group(1) not in mine:
            lines.append(f"c {NVIDIA_MAJOR}:{int(found.group(1))} rwm")
    return lines


def gpu_indices(gpu_ids) -> tuple[str, ...] | None:
    """PURE: the rank's GPU ids as device minors, or None when any is not a plain index."""
    ids = tuple(str(g) for g in gpu_ids or ())
    return ids if ids and all(g.isdigit() for g in ids) else None


def _mounts() -> list[tuple[str, str, set[str]]]:
    found = []
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 4:
                    found.append((parts[1], parts[2], set(parts[3].split(","))))
    except OSError:
        pass
    return found


def _writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


class Tracker:
    """The launcher's cgroups: a directory of its own in each usable hierarchy."""

    def __init__(self, name: str | None) -> None:
        """name: the launcher's own directory in each hierarchy; None: use no cgroup at all."""
        self.kill_root = self.freezer_root = self.devices_root = None
        for mount, fstype, options in _mounts() if name else ():  # fstype: the filesystem /proc/mounts names
            if fstype in ("cgroup", "cgroup2") and _writable(mount):
                _remove_dead_launchers(mount, name)
            if fstype == "cgroup2" and self.kill_root is None and _writable(mount):
                made = self._make(mount, name)  # cgroup.kill exists below the root only
                if made and os.path.exists(os.path.join(made, "cgroup.kill")):
                    self.kill_root = made
                elif made:
                    _rmdir(made)
            elif fstype == "cgroup" and "freezer" in options and _writable(mount):
                self.freezer_root = self._make(mount, name)
            elif fstype == "cgroup" and "devices" in options and _writable(mount):
                self.devices_root = self._make(mount, name)

    @property
    def kind(self) -> str:
        return "cgroup2" if self.kill_root else "cgroup v1 freezer" if self.freezer_root else "none"

    def usable(self) -> bool:
        return bool(self.kill_root or self.freezer_root)

    @staticmethod
    def _make(mount: str, name: str) -> str | None:
        path = os.path.join(mount, name)
        try:
            os.makedirs(path, exist_ok=True)
            return path
        except OSError:
            return None

    def make(self, rank: str, gpus: tuple[str, ...] | None) -> list[str]:
        """The rank's cgroups (its `cgroup.procs` files to join); device files denied."""
        joined = []
        for root in (self.kill_root or self.freezer_root, self.devices_root):
            if root is None:
                continue
            path = os.path.join(root, rank)
            os.makedirs(path, exist_ok=True)
            joined.append(os.path.join(path, "cgroup.procs"))
        if self.devices_root:
            present = os.listdir("/dev")
            for line in device_denials(present, gpus):
                _write(os.path.join(self.devices_root, rank, "devices.deny"), line)
        return joined

    def end(self, rank: str) -> None:
        """Kill every process left in the rank's cgroup and remove it."""
        path = os.path.join(self.kill_root or self.freezer_root or "", rank)
        if self.kill_root and os.path.isdir(path):
            _write(os.path.join(path, "cgroup.kill"), "1", strict=False)
        elif self.freezer_root and os.path.isdir(path):
            _freeze_and_kill(path)
        if (self.kill_root or self.freezer_root) and os.path.isdir(path):
            _wait_empty(path)
            _rmdir(path)
        if self.devices_root:
            _rmdir(os.path.join(self.devices_root, rank))

    def close(self) -> None:
        for root in (self.kill_root, self.freezer_root, self.devices_root):
            if root is None:
                continue
            for entry in _subdirs(root):
                if self.kill_root == root:
                    _write(os.path.join(entry, "cgroup.kill"), "1", strict=False)
                elif self.freezer_root == root:
                    _freeze_and_kill(entry)
                _wait_empty(entry)
                _rmdir(entry)
            _rmdir(root)


def _remove_dead_launchers(mount: str, name: str) -> None:
    """What a launcher killed outright (SIGKILL) left: its directories, once empty, go when the
    next one starts (a directory with processes still in it cannot be removed, and stays)."""
    prefix = name.rsplit("-", 1)[0] + "-"
    for entry in _subdirs(mount):
        base = os.path.basename(entry)
        pid = base.removeprefix(prefix)
        if base.startswith(prefix) and pid.isdigit() and base != name and not os.path.exists(f"/proc/{pid}"):
            for rank in _subdirs(entry):
                _rmdir(rank)
            _rmdir(entry)


def join(procs_files: list[str]) -> None:
    """In the forked child, as root: move this process into its rank's cgroups."""
    for procs in procs_files:
        _write(procs, str(os.getpid()))


def _freeze_and_kill(path: str) -> None:
    state = os.path.join(path, "freezer.state")
    _write(state, "FROZEN", strict=False)
    deadline = time.monotonic() + EMPTY_WAIT_S
    while time.monotonic() < deadline and _read(state) not in ("FROZEN", ""):
        time.sleep(0.002)
    for pid in _members(path):  # frozen: none can fork a new one meanwhile
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _write(state, "THAWED", strict=False)  # the kill is delivered once they run again


def _wait_empty(path: str) -> None:
    """Members disappear when they exit (not when reaped): bounded, it takes milliseconds."""
    deadline = time.monotonic() + EMPTY_WAIT_S
    while _members(path) and time.monotonic() < deadline:
        time.sleep(0.002)


def _members(path: str) -> list[int]:
    return [int(pid) for pid in _read(os.path.join(path, "cgroup.procs")).split()]


def _subdirs(path: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def _write(path: str, text: str, *, strict: bool = True) -> None:
    try:
        with open(path, "w") as file:
            file.write(text)
    except OSError:
        if strict:
            raise


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
