"""A simulated host that loses power: every process of its network namespace ends at once, none
running another instruction after the first is gone.

simcluster.kill_namespace stops each process (SIGSTOP) before it kills any, which is not enough:
killing a stopped process's parent can leave its process group orphaned with stopped members, and
the kernel then sends that group SIGHUP and SIGCONT (POSIX's orphaned process groups). A Ray
worker resumed that way saw its rank die, reported the death and removed the rank's scratch
folder, as a dying host never could: under load test_node_loss then saw a rank's death before
the host's loss (one restart too many) and no folder left on the killed host (seen in about a
third of the runs beside two CPU-bound processes). Here the processes are frozen together in a
freezer cgroup of their own, which no signal resumes, then killed, then thawed to die.
Where the freezer controller is not available (cgroup v2 only, no permission), the stop-then-kill
of kill_namespace is what is left, with its flaw.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .simcluster import kill_namespace, namespace_pids

FREEZER = Path("/sys/fs/cgroup/freezer")
FREEZE_WITHIN_S = 5.0  # a task in an uninterruptible wait freezes when it leaves it


def kill_at_once(netns: str, timeout_s: float = 5.0) -> int:
    """Every process of the host's namespace frozen together, SIGKILLed, thawed; how many."""
    group = FREEZER / f"gsmh-kill-{netns}-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:  # no cgroup v1 freezer here, or not ours to use
        return kill_namespace(netns, timeout_s)
    try:
        pids = _move_all(netns, group)
        _set_state(group, "FROZEN")
        for pid in _members(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        _set_state(group, "THAWED", wait=False)  # the killed die as they thaw; nothing else is left frozen
        _remove(group, timeout_s)
    deadline = time.monotonic() + timeout_s
    while namespace_pids(netns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def _move_all(netns: str, group: Path) -> list[int]:
    """Every process of the namespace into the group, again for any forked outside it meanwhile
    (a child forked after its parent moved is born in the group)."""
    moved: list[int] = []
    for _ in range(20):
        new = [pid for pid in namespace_pids(netns) if pid not in moved]
        if not new:
            break
        for pid in new:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except OSError:  # gone meanwhile
                continue
            moved.append(pid)
    return moved


def _members(group: Path) -> list[int]:
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _set_state(group: Path, state: str, *, wait: bool = True) -> None:
    try:
        (group / "freezer.state").write_text(state)
    except OSError:
        return
    deadline = time.monotonic() + FREEZE_WITHIN_S
    while wait and time.monotonic() < deadline:
        try:
            if (group / "freezer.state").read_text().strip() == state:
                return
        except OSError:
            return
        time.sleep(0.005)


def _remove(group: Path, timeout_s: float) -> None:
    """The group, once its last process has died (a cgroup with members cannot be removed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
