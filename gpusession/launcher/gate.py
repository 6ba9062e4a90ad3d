"""What the warm parent does, run as root by the launcher, with each connection and request
(run/node/zygote.py calls these; without a Gate it forks as its own account, as before).

- a connection is kept only if its peer (SO_PEERCRED) is the service account;
- a fork request names the account: refused (the reason goes back to the worker actor) unless
  policy.py allows it and the user's limits.conf entries can be applied (userlimits.py); else
  the rank gets a cgroup and a private temporary directory (<dir>/scratch/<uid>, 0700, the
  user's), and the child joins the cgroup, takes the user's resource limits, drops to the user
  (drop.py) and only then runs gpusession's rank code;
- when a rank ends (or is killed) everything left in its cgroup is killed and the cgroup removed;
  the user's temporary directory goes with the last of that user's ranks on the node.
Without a writable cgroup the launcher is a child subreaper: what a rank left behind (orphans
reparented to the launcher) is killed once that user has no rank running on the node.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import pwd
import shutil
import signal
import socket
import struct
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import rootfs
from . import cgroups, drop, userlimits
from .policy import Account, Rules, peer_allowed, refusal

RM = shutil.which("rm", path="/usr/bin:/bin")
REMOVING = ".removing-"  # a user's scratch folder renamed aside, being removed
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class Plan:
    account: Account
    tmpdir: str
    cgroup: str  # its name under the launcher's cgroups
    procs_files: tuple[str, ...]
    role: str = "rank"  # or "store": an attempt's rendezvous store, which runs no user code
    limits: userlimits.Settings = userlimits.Settings()  # the user's, from /etc/security/limits.conf


class Gate:
    def __init__(self, directory: Path, rules: Rules, *, use_cgroups: bool = True) -> None:
        self.rules = rules
        self.node = socket.gethostname()
        self.scratch = directory / "scratch"
        rootfs.ensure_directory(self.scratch, uid=0, gid=0, mode=0o711)  # users pass through to their own
        self.tracker = cgroups.Tracker(f"gpusession-launcher-{os.getpid()}" if use_cgroups else None)
        self._names = itertools.count(1)
        self._plans: dict[int, Plan] = {}  # each live child: what it was started as
        self._removers: set[int] = set()  # children removing users' scratch folders (_remove_aside)
        self._said: set[str] = set()  # limits.conf lines skipped, logged once each
        for left in self.scratch.glob(f"{REMOVING}*"):  # a launcher stopped while one was removed
            self._remove_in_child(left)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of ranks come to us (reaped by the zygote loop)

    # ----- in the launcher ---------------------------------------------------------------------
    def accepts(self, conn: socket.socket) -> bool:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return peer_allowed(uid, self.rules)

    def prepare(self, request: dict) -> tuple[Plan | None, str | None]:
        """The plan of a child for this request, or why it is refused."""
        name = str(request.get("account") or "")
        found = _lookup(name)
        why = refusal(name, found, self.rules, self.node)
        if why:
            return None, why
        try:
            limits, decided = userlimits.for_account(found)
        except userlimits.Unusable as exc:
            return None, f"the launcher on node {self.node} does not start a rank of {name!r}: {exc}"
        except Exception as exc:  # a root daemon serving every user does not end over one user's limits
            traceback.print_exc()
            return None, (f"the launcher on node {self.node} could not decide the resource limits of {name!r} "
                          f"({type(exc).__name__}: {exc}); its log on that node says more")
        self._log_skipped(decided.skipped)
        tmpdir = self.scratch / str(found.pw_uid)
        try:
            rootfs.ensure_directory(tmpdir, uid=found.pw_uid, gid=found.pw_gid, mode=0o700)
            cgroup = f"rank-{next(self._names)}"
            procs = self.tracker.make(cgroup, cgroups.gpu_indices(request.get("gpus"))) if self.tracker.usable() else []
        except (OSError, rootfs.UnsafePath) as exc:
            return None, f"the launcher on node {self.node} could not prepare a rank of {name!r}: {exc}"
        role = "store" if request.get("role") == "store" else "rank"
        return Plan(found, str(tmpdir), cgroup, tuple(procs), role, limits), None

    def _log_skipped(self, lines: tuple[str, ...]) -> None:
        for line in lines:
            if line not in self._said:
                self._said.add(line)
                print(f"gpusession launcher: skipped a limits.conf line (as pam_limits does): {line}",
                      file=sys.stderr, flush=True)

    def started(self, pid: int, plan: Plan) -> None:
        self._plans[pid] = plan

    def ended(self, pid: int) -> None:
        """A child was reaped (or is being killed): nothing it started stays."""
        plan = self._plans.pop(pid, None)
        if plan is None:
            return
        self.tracker.end(plan.cgroup)  # (without a usable one: its devices cgroup, if any)
        uid = plan.account.pw_uid
        if not self.tracker.usable() and not any(p.account.pw_uid == uid and p.role == "rank"
                                                 for p in self._plans.values()):
            _kill_orphans(uid, set(self._plans))  # (a store runs no user code: it leaves none)
        if not any(p.account.pw_uid == uid for p in self._plans.values()):
            self._remove_aside(plan.tmpdir)

    def _remove_aside(self, tmpdir: str) -> None:
        """A user's scratch folder goes without holding up the launcher, which forks every rank of
        the node: it is renamed aside at once (the user's next rank gets a new one) and removed by
        a child process (`rm -rf`, which follows no symlink and walks any depth), so a folder of
        millions of files, or one nested deeper than a recursive walk allows, neither stalls nor
        ends the launcher."""
        self._reap_removers()
        aside = self.scratch / f"{REMOVING}{os.getpid()}-{next(self._names)}"
        try:
            os.rename(tmpdir, aside)  # both in root's scratch folder: the user cannot move either
        except OSError:
            return  # gone already
        self._remove_in_child(aside)

    def _remove_in_child(self, path: Path) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # none of the launcher's sockets
                if RM:
                    os.execv(RM, ["rm", "-rf", "--one-file-system", "--", str(path)])
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os._exit(0)
        self._removers.add(pid)

    def _reap_removers(self) -> None:
        for pid in list(self._removers):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the zygote's loop (waitpid(-1))
                done = pid
            if done:
                self._removers.discard(pid)

    def kill(self, pid: int) -> None:
        plan = self._plans.get(pid)
        if plan is not None and self.tracker.usable():
            self.tracker.end(plan.cgroup)

    def close(self) -> None:
        for pid in list(self._plans):
            self.ended(pid)
        self.tracker.close()

    # ----- in the forked child, still root ------------------------------------------------------
    def enter(self, plan: Plan, keep_fd: int) -> None:
        """Join the rank's cgroups, let go of the launcher's output, become the user."""
        cgroups.join(list(plan.procs_files))
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):  # the launcher's log is root's: the rank writes to its own pipes
            os.dup2(null, std)
        os.close(null)
        _prctl(PR_SET_CHILD_SUBREAPER, 0)
        userlimits.apply(plan.limits)  # as root (a hard limit may be above the launcher's), as a login does
        drop.become(plan.account, keep_fd=keep_fd, tmpdir=plan.tmpdir)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of uid cleared it: set it again
        # A change of uid also made it undumpable: its /proc files root's, so its own user could not
        # read /proc/self/environ nor attach a debugger (py-spy). It holds nothing of root's (the
        # launcher holds no secret), so it is the user's like any process of theirs; other users
        # still may not trace or read it (another uid).
        _prctl(PR_SET_DUMPABLE, 1)


def _lookup(name: str) -> Account | None:
    if not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = frozenset({entry.pw_gid})
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups)


def _kill_orphans(uid: int, live: set[int]) -> None:
    """The fallback without cgroups: the launcher's children that are no rank of its own (orphans
    it adopted as subreaper) and run as `uid`, which has no rank here any more."""
    import psutil

    for proc in psutil.Process().children():
        try:
            if proc.pid not in live and proc.uids().real == uid:
                proc.kill()
        except psutil.Error:
            pass


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:
        pass
