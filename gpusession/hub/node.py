"""`gpusession hub node`: a GPU machine joins a hub's cluster (run as root on each extra node).

It reads Ray's token (from a file only root may read, or its stdin), starts root's launcher with a
clean environment (the ranks' warm parent: each rank runs as its user), then the node's Ray as the
service account (`ray start --address`, GPUSESSION_LAUNCHER naming this node's launcher), and
serves until Ctrl-C or SIGTERM, or until its Ray node ends (the hub stopped) or its launcher does:
then it stops the Ray node (and whatever of it is left) and the launcher by their pids, on every
path."""
from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ..cluster.localhead import READY_LINE, failure_cause, terminate
from . import accounts
from ..launcher import rootfs
from .launching import LauncherFailed, start_launcher, stop_launcher
from .nodeplan import NodeOptions, node_environment, ray_node_command
from .plan import NOT_SET_UP, HubLayout

TOKEN_MAX_BYTES = 4096
STOP_TIMEOUT_S = 30.0
LEFTOVER_WAIT_S = 5.0  # for the node's processes to follow its `ray start` out
PR_SET_CHILD_SUBREAPER = 36
WATCH_S = 0.5  # how often the command looks whether its Ray node and its launcher still run
PRIVATE_FILES = Path(__file__).parent / "private_files"  # its sitecustomize: workers use umask 077


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # systemd's stop; the terminal gone (SSH with one too)


class NodeStopped(Exception):
    """SIGTERM or SIGHUP arrived, or the output's reader went away: stop as on Ctrl-C."""


class NodeFailed(RuntimeError):
    """The node could not join; the message says why and what to do."""


def say(line: str) -> None:
    try:
        print(f"gpusession hub node: {line}", flush=True)
    except OSError:  # the output's reader went away (output_gone): the node stops all the same
        pass


def run_node(layout: HubLayout, options: NodeOptions, *, ready_timeout_s: float = 600.0, stdin=None) -> int:
    problem = _refusal(layout)
    if problem:
        say(problem)
        return 2
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)
    become_subreaper()
    launcher = ray = None
    try:
        token = read_token(options.token_file, stdin or sys.stdin)
        account = accounts.ensure_service_user(layout.service_user, layout.cluster_dir)
        prepare_node_directories(layout, account)
        launcher, launcher_socket = start_launcher(layout, account.pw_name, options.min_uid, ready_timeout_s)
        say(f"the launcher runs (pid {launcher.pid}): ranks on {socket.gethostname()} run as their users "
            f"(uid {options.min_uid} and up)")
        ray = start_ray_node(layout, options, account, token, launcher_socket)
        wait_joined(ray, layout.hub_dir / "node.log", options.address, ready_timeout_s)
        say(f"joined the hub's cluster at {options.address} as {layout.service_user} (Ray node pid {ray.pid}, its "
            f"log: {layout.hub_dir / 'node.log'}). Ctrl-C leaves the cluster.")
        while ray.poll() is None and launcher.poll() is None:
            if output_gone(sys.stdout):
                output_to_null()
                raise NodeStopped()
            time.sleep(WATCH_S)
        if launcher.poll() is not None:
            say(f"the launcher ended (exit status {launcher.returncode}): no rank can start here without it, so "
                f"the node leaves the cluster. Its log: {layout.hub_dir / 'launcher.log'}")
        else:
            say(f"the Ray node ended (exit status {ray.returncode}): the hub's head stopped or cannot be reached. "
                f"Its log: {layout.hub_dir / 'node.log'}")
        return 1
    except (KeyboardInterrupt, NodeStopped):
        say("leaving the cluster: stopping the Ray node, then the launcher...")
        return 0
    except (accounts.HubSetupError, rootfs.UnsafePath, LauncherFailed, NodeFailed) as exc:
        say(str(exc))
        return 1
    finally:
        for signum in STOP_SIGNALS:  # a second one must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        try:
            stop_ray_node(ray, keep={launcher.pid} if launcher is not None else set())
        finally:
            stop_launcher(launcher)  # by its pid, after Ray: no rank is asked for any more
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)


def output_gone(stream) -> bool:
    """Whether the pipe or socket the command writes to has lost its reader: how `ssh root@NODE
    gpusession hub node ...` without a terminal ends. SSH then sends no SIGHUP (only a terminal's
    end does) and the command would run on, cut off from whoever started it; its stdout, a pipe from
    sshd, reports an error once sshd closes it. A terminal, a file or /dev/null never does."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):  # closed, or no descriptor behind it
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLERR | select.POLLHUP)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def output_to_null() -> None:
    """stdout and stderr to /dev/null once their reader is gone: the stop then writes its lines
    nowhere, and Python's last flush at exit cannot fail (its exit status would be 120)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)


def read_token(source: str, stdin) -> str:
    """Ray's token: stdin's first line ("-"), or a regular file of root's that no other account may
    read, opened without following a symlink or blocking on a FIFO. NodeFailed names what is wrong."""
    if source == "-":
        text = stdin.readline(TOKEN_MAX_BYTES + 1).strip()
        if not text:
            raise NodeFailed("--token-file -: nothing on stdin. Pipe the hub's token file in: "
                             "gpusession hub node ... --token-file - < ray_token")
        return text
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NodeFailed(f"--token-file {source}: cannot open it ({exc.strerror}; a symbolic link is not "
                         "followed). Give a file of root's, mode 0600, or - for stdin.") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != 0 or found.st_mode & 0o077:
            raise NodeFailed(f"--token-file {source}: not a regular file of root's that only root may read (owner "
                             f"uid {found.st_uid}, mode {stat.S_IMODE(found.st_mode):o}): another account could know "
                             "the token. chown root and chmod 600 it, or pipe it in with --token-file -.")
        text = os.read(fd, TOKEN_MAX_BYTES + 1).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text or len(text) > TOKEN_MAX_BYTES:
        raise NodeFailed(f"--token-file {source}: holds no token (1 to {TOKEN_MAX_BYTES} bytes of text): copy the "
                         "hub's ray_token file again.")
    return text


def prepare_node_directories(layout: HubLayout, account) -> None:
    """As on the hub's machine (accounts.prepare_directories), without the gateway's: STATE root's
    (0755), hub/ root's alone (the logs), cluster/ and Ray's temporary directory the account's (0700)."""
    layout.state.parent.mkdir(parents=True, exist_ok=True)
    rootfs.ensure_directory(layout.state, uid=0, gid=0, mode=0o755)
    rootfs.ensure_directory(layout.hub_dir, uid=0, gid=0, mode=0o700)
    rootfs.ensure_directory(layout.cluster_dir, uid=account.pw_uid, gid=account.pw_gid, mode=0o700)
    rootfs.ensure_directory(layout.ray_tmp, uid=account.pw_uid, gid=account.pw_gid, mode=0o700)


def start_ray_node(layout: HubLayout, options: NodeOptions, account, token: str,
                   launcher_socket: str) -> subprocess.Popen:
    """The node's Ray as the service account (`ray start --address --block`), starting."""
    from ..cluster.raycluster import machine_gpu_count

    command = ray_node_command(layout.python, options, temp_dir=layout.ray_tmp, real_gpus=machine_gpu_count(),
                               free_port=_free_port)
    env = node_environment(layout, account.pw_name, token=token, launcher_socket=launcher_socket,
                           private_files=PRIVATE_FILES, inherited=os.environ)
    with open(layout.hub_dir / "node.log", "w") as log:  # root's file; the node writes through the descriptor
        return subprocess.Popen(command, env=env, cwd=str(layout.cluster_dir), user=account.pw_uid,
                                group=account.pw_gid, extra_groups=[], umask=0o077, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_joined(proc: subprocess.Popen, log_path: Path, address: str, timeout_s: float) -> None:
    """Until the node's Ray says it runs; NodeFailed, naming why from its log, if it ends first or
    is not up within timeout_s (the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    while READY_LINE not in _read(log_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            text = _read(log_path)
            why = f"it exited (status {proc.returncode})" if proc.returncode is not None else \
                f"it was not up within {timeout_s:.0f} s"
            cause = failure_cause(text) or last_error(text) or "\n".join(text.splitlines()[-15:])
            raise NodeFailed(f"The Ray node did not join the hub's cluster at {address}: {why}. Is the address "
                             f"right, the token this start's, the head's port reachable from here? Its log "
                             f"({log_path}) says:\n{cause}")
        time.sleep(0.2)


def last_error(log_text: str) -> str | None:
    """PURE: the last line of a log that states an error ("RuntimeError: Failed to connect to GCS
    ...", Ray's "Unauthenticated" status), not a traceback's frames."""
    found = [line.strip() for line in log_text.splitlines()
             if re.match(r"\s*[\w.]*(Error|Exception)\b.*:", line) or "nauthenticated" in line]
    return found[-1][-600:] if found else None


def stop_ray_node(proc: subprocess.Popen | None, *, keep: set[int] = frozenset()) -> None:
    """SIGTERM to `ray start --block` (it stops this node's Ray processes), then SIGKILL to whatever
    of the node outlives it: what it had started (its raylet's workers), and what was orphaned when
    it ended by itself (this command is their subreaper). `keep`: our other children (the launcher)."""
    family: list[psutil.Process] = []
    if proc is not None and proc.poll() is None:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        terminate(proc.pid, timeout_s=STOP_TIMEOUT_S)
    if proc is not None:
        proc.wait()
    _, alive = psutil.wait_procs(family, timeout=LEFTOVER_WAIT_S)
    orphans = [child for child in psutil.Process().children() if child.pid not in keep]
    for leftover in [*alive, *orphans, *(grandchild for child in orphans for grandchild in _descendants(child))]:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs([*alive, *orphans], timeout=LEFTOVER_WAIT_S)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def become_subreaper() -> None:
    """Orphans of the node's Ray (its workers, once `ray start` has ended) become our children, so
    that stop_ray_node finds them: nothing of the node outlives this command."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the descendants found at the stop are all there is
        pass


def _refusal(layout: HubLayout) -> str | None:
    if os.geteuid() != 0:
        return ("gpusession hub node runs as root (its launcher starts each rank as its user): run it with sudo.")
    if not layout.python.exists():  # (a node needs no proxy: JupyterHub runs on the hub's machine)
        return NOT_SET_UP.format(path=layout.python, prefix=layout.prefix)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _raise_stopped(signum, frame) -> None:
    raise NodeStopped()
