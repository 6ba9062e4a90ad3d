"""A Ray head for this machine, run as a `ray start --head --block` subprocess.

`gpusession cluster start` and a Jupyter server with `c.GPUSession.ray_address = "local"` use it.
Its address goes to GPUSESSION_HOME/local-head.json, where kernels and
`raycluster.ensure_connected()` find it. The `ray start --block` process is the head's
supervisor: SIGTERM to it (and only it) stops every Ray process of this head, never another
cluster on the same machine (unlike `ray stop`, which stops them all).
"""
from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import enum
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import psutil

from . import rayprivate
from .where import DEFAULT_LOCAL_GPUS, STARTUP_TIMEOUT, local_head_file, machine_gpu_count, state_dir
from .where import reachable as _reachable

READY_LINE = "Ray runtime started"
START_ATTEMPTS = 3  # `ray start` tried again only when its head missed Ray's fixed 30 s start window


log = logging.getLogger(__name__)


class Bringup(str, enum.Enum):
    """The "state" a Jupyter server answers while it brings up its local head (no state: ready)."""
    STARTING = "starting"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class LocalHeadError(RuntimeError):
    """The local Ray head could not be started or stopped."""


@dataclass(frozen=True)
class LocalHead:
    address: str
    pid: int
    gpus: int
    logical: bool
    started_at: float
    log_path: str
    auth_mode: str = "token"  # Ray's RAY_AUTH_MODE; clients of an explicit address must set it too
    # The process's start time as the OS tells it (psutil): a recorded pid is this head only while
    # the process holding it started then. The OS gives a dead process's pid to a new one once its
    # counter wraps (pid_max is often 32768); a SIGTERM to that one could stop a stranger's
    # `ray start --block`. None in records of older versions.
    process_started: float | None = None

    def client_env(self) -> dict[str, str]:
        """What a process needs in its environment to join this head (Ray's token mode included)."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": self.auth_mode}

    def describe(self) -> str:
        kind = "logical GPUs (training runs on the CPU)" if self.logical else "GPUs"
        return f"local Ray head at {self.address}: {self.gpus} {kind}, pid {self.pid}, log {self.log_path}"


def status() -> LocalHead | None:
    """The head recorded in GPUSESSION_HOME, if its process is alive and its address answers."""
    try:
        head = LocalHead(**json.loads(local_head_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return head if _is_head_process(head) and _reachable(head.address) else None


def start(*, gpus: int | None = None, timeout_s: float = 120.0, node_ip: str | None = None,
          spawned: Callable[[LocalHead], None] | None = None) -> tuple[LocalHead, bool]:
    """Start a head unless one is already recorded and alive; returns (head, started_by_us).
    node_ip: the address it advertises (other nodes join it there); default Ray's choice.
    spawned(head) is called as soon as the process runs, before it is ready (a caller that may
    be told to stop meanwhile then knows what to stop), again for each new try.

    Ray gives a new head's raylet a fixed 30 s to register (ray/_private/node.py); on a loaded
    machine it misses that window and `ray start` exits. That failure is tried again, after the
    try's whole process group is stopped; any other failure is raised at once."""
    running = status()
    if running is not None:
        return running, False
    for attempt in range(START_ATTEMPTS):
        head, proc = _spawn(gpus, node_ip)
        if spawned is not None:
            spawned(head)
        try:
            _wait_ready(proc, Path(head.log_path), timeout_s)
            return head, True
        except LocalHeadError:
            local_head_file().unlink(missing_ok=True)
            if not retry_start(Path(head.log_path).read_text(errors="replace"), attempt):
                raise
            _stop_group(proc)
            log.warning("The local Ray head missed Ray's 30 s start window (a loaded machine?); trying again.")
    raise AssertionError("unreachable: the last try raises")


# `ray start --head` opens these servers; each has a fixed default port (the client server 10001,
# the dashboard agent 52365, workers 10002-19999) or one Ray picks. A second head on this machine
# (another user's, a hub's, a test's) then fails to bind, and the head dies moments after it said
# it had started. Every one gets a port of its own; worker ports 0 are the OS's choice.
PORT_FLAGS = ("--ray-client-server-port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--runtime-env-agent-port", "--metrics-export-port", "--node-manager-port", "--object-manager-port")
# Lines of Ray's logs that say why a process of the head could not run (the first one found is shown)
FAILURE_MARKERS = ("Address already in use", "Failed to bind", "Failed to add port", "Permission denied",
                   "No space left on device", "Cannot allocate memory")


def port_options(free_port: Callable[[], int]) -> list[str]:
    """PURE over free_port: the `ray start` flags that give every server of the head a free port."""
    return [f"{flag}={free_port()}" for flag in PORT_FLAGS] + ["--min-worker-port=0", "--max-worker-port=0"]


def failure_cause(log_text: str) -> str | None:
    """PURE: the first line of a head's log that says why one of its processes failed, if any."""
    for line in log_text.splitlines():
        if any(marker in line for marker in FAILURE_MARKERS):
            return line.strip()[-400:]
    return None


def explain(head: LocalHead) -> str:
    """' The Ray head's log (PATH) says: LINE' when its log names a cause; else where the log is."""
    try:
        cause = failure_cause(Path(head.log_path).read_text(errors="replace"))
    except OSError:
        cause = None
    return (f" The Ray head's log ({head.log_path}) says: {cause}" if cause
            else f" The Ray head's log: {head.log_path}.")


def retry_start(log_text: str, attempt: int) -> bool:
    """PURE: try `ray start` again after this failed try?"""
    return STARTUP_TIMEOUT in log_text and attempt < START_ATTEMPTS - 1


def _spawn(gpus: int | None, node_ip: str | None = None) -> tuple[LocalHead, subprocess.Popen]:
    real = machine_gpu_count()
    count = real or int(gpus or os.environ.get("GPUSESSION_LOCAL_GPUS") or DEFAULT_LOCAL_GPUS)
    address = f"{node_ip or rayprivate.node_ip_address()}:{_free_port()}"
    home = state_dir()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "local-head.log"
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
               f"--node-ip-address={address.rpartition(':')[0]}", f"--port={address.rpartition(':')[2]}",
               "--include-dashboard=false", "--disable-usage-stats", *port_options(_free_port)]
    if not real:
        command.append(f"--num-gpus={count}")
    auth_mode = os.environ.get("RAY_AUTH_MODE") or "token"  # Ray's default for a new cluster
    env = {**os.environ, "GPUSESSION_HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # SIGTERM stops at once (the broker never drains)
    if auth_mode == "token":  # the head listens on the network: require Ray's token, making one if needed
        _ensure_ray_token(env)
        env["RAY_AUTH_MODE"] = "token"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(home), start_new_session=True)  # Ctrl-C in a terminal is not for it
    head = LocalHead(address, proc.pid, count, not real, time.time(), str(log_path), auth_mode,
                     _process_started(proc.pid))
    local_head_file().write_text(json.dumps(asdict(head)))  # at once: `cluster stop` finds it even if we die
    return head, proc


def _stop_group(proc: subprocess.Popen) -> None:
    """Every process of a failed try: `ray start` ran in a session of its own (start_new_session),
    so its process group holds only what that try started (a GCS or raylet it left behind)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def stop(*, pid: int | None = None, timeout_s: float = 30.0) -> tuple[LocalHead, bool] | None:
    """Stop the recorded head (SIGTERM to its supervisor, SIGKILL to what is left after timeout_s)
    and forget it; with `pid`, only if the recorded head is that process. Returns the record and
    whether its head was still running, or None if no head is recorded."""
    try:
        head = LocalHead(**json.loads(local_head_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if pid is not None and head.pid != pid:
        return None
    was_running = end(head, timeout_s=timeout_s)
    local_head_file().unlink(missing_ok=True)
    return head, was_running


def end(head: LocalHead, *, timeout_s: float) -> bool:
    """Stop `head` if its process is still running and is that head (never whatever took its
    pid since); False if it was not running."""
    if not _is_head_process(head):
        return False
    terminate(head.pid, timeout_s=timeout_s)
    return True


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line a process we started writes to its stdout pipe (its ready or failed line),
    or a sentence saying it wrote none within timeout_s."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout_s):
            return f"no answer within {timeout_s:.0f} s"
    return proc.stdout.readline()


def terminate(pid: int, *, timeout_s: float) -> None:
    """SIGTERM one process we started, then SIGKILL it and its children if it outlives timeout_s."""
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return
    _, alive = psutil.wait_procs([proc], timeout=timeout_s)
    for leftover in family if alive else []:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            pass


def _ensure_ray_token(env: dict) -> None:
    """Ray's own `ray get-auth-token --generate`: keeps an existing token (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), else writes a new ~/.ray/auth_token."""
    done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise LocalHeadError(f"Could not find or make Ray's authentication token: {done.stderr.strip()[-500:]}")


def _is_head_process(head: LocalHead) -> bool:
    try:
        proc = psutil.Process(head.pid)
        return ("--block" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE
                and (head.process_started is None or abs(proc.create_time() - head.process_started) < 0.01))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:  # it already exited: the head's wait reports that
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if READY_LINE in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise LocalHeadError(f"`ray start` exited with status {proc.returncode} before the head was up "
                                 f"(log: {log_path}).{_cause(log_path)}\nIts last lines:\n{_tail(log_path)}")
        time.sleep(0.2)
    terminate(proc.pid, timeout_s=10)
    raise LocalHeadError(f"The local Ray head did not start within {timeout_s:.0f} s; stopped it "
                         f"(log: {log_path}).{_cause(log_path)}\nIts last lines:\n{_tail(log_path)}")


def _cause(log_path: Path) -> str:
    cause = failure_cause(log_path.read_text(errors="replace"))
    return f" Cause: {cause}" if cause else ""


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
