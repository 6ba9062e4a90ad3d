"""A user's own gateway (issues 28 and 32), the caller's side: for one user (`gpusession lab`, a
kernel or script with RAY_ADDRESS) calls run in the caller's process as before, except detached
runs: the same gateway process the hub runs (main.py, `--user`) hosts them, started as the user
themself the first time a kernel detaches a run, so the run goes on when that kernel dies.

Where it lives, per cluster, in a directory only the user may enter (checked, never followed
through a symlink):

    $GPUSESSION_HOME/gateways/<host>-<port>/     0700, the user's (<host>:<port>: the cluster's address)
        socket         the gateway's Unix socket (0600; the gateway also refuses any other uid)
        gateway.json   {pid, socket, address, started, log}, while it runs
        gateway.log    its log (Ray's and its own)
        start.lock     held by a kernel while it looks for the gateway and starts one
        gateway.lock   held by the gateway for as long as it runs (one per directory)

It is a Ray driver of the cluster (the address and Ray's token come from the kernel that started
it), acts at the broker with the user's own identity (GPUSESSION_USER / GPUSESSION_IDENTITY, as
an in-process run does) and holds no admin token. It runs in a session of its own (setsid), so
it outlives the kernel that started it; it exits once it has kept no detached run and had no
connection for IDLE_ENV seconds (DEFAULT_IDLE_S), and when the cluster's head is gone.

gs.runs(all=True) and gs.attach find it when it runs and say there is none when it does not;
only a detach starts it. The embedded cluster (a head inside the kernel, no RAY_ADDRESS) ends
with its kernel: nothing can be detached there. Imports no Ray (listing and attaching need none).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ..cluster import where
from ..errors import GPUSessionError
from .keeping import detach_policy_from_env

GATEWAYS_DIR = "gateways"
SOCKET_NAME, RECORD_NAME, LOG_NAME = "socket", "gateway.json", "gateway.log"
START_LOCK, GATEWAY_LOCK = "start.lock", "gateway.lock"
IDLE_ENV = "GPUSESSION_USER_GATEWAY_IDLE_S"
DEFAULT_IDLE_S = 600.0  # with no detached run kept and no kernel connected for this long, it exits
START_TIMEOUT_S = 300.0  # its first `ray.init` on a loaded machine takes tens of seconds
_ADDRESS = re.compile(r"^\[?[A-Za-z0-9._:-]+\]?:\d{1,5}$")


class NoUserGateway(GPUSessionError):
    """Detached runs have no gateway here (the embedded cluster, or none started yet)."""


# ----- PURE: which cluster, which directory, when to exit -------------------------------------------
def detach_refusal(address: str | None) -> str | None:
    """Why a process with no hub gateway cannot detach a run, or None (`address`: its cluster's)."""
    if address:
        return None
    return ("A detached run needs a cluster that outlives this kernel, and this kernel has none to join (no "
            "RAY_ADDRESS, no head started by `gpusession cluster start` or `gpusession lab`): its calls run on the "
            "embedded cluster, a Ray head inside the kernel that ends with it. Use `gpusession lab` (or `gpusession "
            "cluster start`, or set RAY_ADDRESS to your cluster) and submit again, or submit without detach=True.")


def directory_for(home: Path, address: str) -> Path:
    """The user gateway's directory for the cluster at `address` (host:port)."""
    key = re.sub(r"[^A-Za-z0-9._-]", "-", address.strip("[]"))[:160].lstrip(".") or "cluster"
    return home / GATEWAYS_DIR / key


def idle_limit(env) -> float:
    """IDLE_ENV as seconds (> 0), or ValueError naming it."""
    raw = env.get(IDLE_ENV)
    if raw in (None, ""):
        return DEFAULT_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{IDLE_ENV} must be a number of seconds above 0 (how long a user's gateway with no "
                         f"detached run and no kernel waits before it exits; default {DEFAULT_IDLE_S:g}); got {raw!r}.")
    return value


def exit_reason(*, now: float, busy_at: float, idle_s: float, ray_misses: int, max_misses: int) -> str | None:
    """Why the user gateway exits now, or None. `busy_at`: when it last kept a run or had a
    connection; `ray_misses`: checks in a row that found the cluster's head gone."""
    if ray_misses >= max_misses:
        return "the cluster's head does not answer: Ray is gone"
    if now - busy_at >= idle_s:
        return f"no detached run and no connection for {idle_s:g} s"
    return None


# ----- where: this process's cluster ------------------------------------------------------------------
def cluster_address() -> str | None:
    """This process's cluster as host:port: RAY_ADDRESS, else the head `gpusession cluster start`
    (or `gpusession lab`) recorded, else the cluster this process joined itself unless it started
    it (the embedded cluster: None). A RAY_ADDRESS that only hints at the cluster ("auto") is
    joined to learn its address; otherwise no Ray is imported."""
    named = where.target_address()
    if named and _ADDRESS.match(named):
        return named
    if named:
        from ..cluster.raycluster import ensure_connected

        ensure_connected()
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    from ..cluster import rayprivate

    return None if rayprivate.head_started_here() else ray.get_runtime_context().gcs_address


def private_directory(path: Path) -> Path:
    """`path` (made if missing, with its parents) as a directory this account owns and nobody
    else may enter; a symlink, another account's directory or a looser mode is refused."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise NoUserGateway(f"{path} is not a directory (a symlink or a file): gpusession will not put your gateway's "
                            "socket there. Remove it (and check who made it), then try again.")
    if found.st_uid != os.geteuid():
        raise NoUserGateway(f"{path} belongs to uid {found.st_uid}, not to you (uid {os.geteuid()}): gpusession will "
                            "not put your gateway's socket there. Remove it, then try again.")
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


# ----- find, start ------------------------------------------------------------------------------------
def socket_path(address: str) -> Path:
    return directory_for(where.state_dir(), address) / SOCKET_NAME


def answers(path: Path, timeout_s: float = 5.0) -> bool:
    """Whether a gateway listens at `path` now."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def find(address: str | None = None) -> str | None:
    """The socket of this user's gateway for this process's cluster (or the cluster at `address`:
    a Jupyter server asks for its kernels'), if one runs."""
    address = address or cluster_address()
    if not address:
        return None
    path = socket_path(address)
    return str(path) if answers(path) else None


def none_runs(what: str, address: str | None = None) -> str:
    """The sentence a list/attach/cancel gets when no gateway of this user runs."""
    address = address or cluster_address()
    if not address:
        return f"{what}: {detach_refusal(None)}"
    return (f"{what}: no detached run of yours is kept on the cluster at {address}: your gateway (which hosts "
            f"them; {directory_for(where.state_dir(), address)}) is not running. It starts with your first "
            "submit(detach=True) and exits once it has kept no run and had no kernel for "
            f"{IDLE_ENV} seconds; a detached run's records go with it.")


def detached_gateway(what: str, *, start: bool = False, address: str | None = None) -> str:
    """The gateway that hosts this account's detached runs: the hub's (GPUSESSION_GATEWAY), else
    this user's own for this process's cluster, started when `start` (a detach) and none runs;
    NoUserGateway (naming `what`) when there is none to ask."""
    from .client import gateway_path

    hub = gateway_path()
    if hub:
        return hub
    if start:
        return ensure()
    found = find(address)
    if found is None:
        raise NoUserGateway(none_runs(what, address))
    return found


def ensure() -> str:
    """The socket of this user's gateway for this process's cluster, started if none runs
    (NoUserGateway: the embedded cluster, or the gateway could not start: the reason and its log)."""
    address = cluster_address()
    refusal = detach_refusal(address)
    if refusal:
        raise NoUserGateway(refusal)
    idle_limit(os.environ)  # a bad value is the caller's mistake: said here, not in the gateway's log
    detach_policy_from_env(os.environ)  # likewise the default limit and retention it will keep to
    folder = private_directory(directory_for(where.state_dir(), address))
    path = folder / SOCKET_NAME
    if answers(path):
        return str(path)
    with _locked(folder / START_LOCK):
        if not answers(path):  # another kernel may have started it meanwhile
            start(folder, address)
    return str(path)


@contextmanager
def _locked(path: Path):
    with open(path, "a") as held:
        os.fchmod(held.fileno(), 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def start(folder: Path, address: str, *, timeout_s: float = START_TIMEOUT_S) -> subprocess.Popen:
    """The gateway process for `folder`, serving once this returns: a session of its own, stdin
    closed, its log in the folder; this process only reaps it (its end is the gateway's own)."""
    from ..cluster.localhead import first_line
    from .process import IMPORT_ROOT

    env = {**os.environ, "RAY_ADDRESS": address, "GPUSESSION_HOME": str(where.state_dir())}
    env.pop("GPUSESSION_GATEWAY", None)
    log_path = folder / LOG_NAME
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gpusession.gateway.main", "--user", str(folder / SOCKET_NAME)],
                                env=env, cwd=IMPORT_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log_fd, text=True, start_new_session=True)
    finally:
        os.close(log_fd)
    line = first_line(proc, timeout_s)
    proc.stdout.close()
    threading.Thread(target=proc.wait, name="gpusession-user-gateway-reaper", daemon=True).start()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = {"failed": line.strip() or f"it exited (status {proc.poll()}) without a word"}
    if not isinstance(answer, dict) or "ready" not in answer:
        if proc.poll() is None:
            proc.kill()
        said = answer.get("failed") if isinstance(answer, dict) else line
        raise NoUserGateway(f"Your gpusession gateway (which hosts detached runs) did not start: {said}. "
                            f"Its log: {log_path}.")
    return proc


def record(folder: Path) -> dict | None:
    """The running gateway's record (gateway.json), if any."""
    try:
        found = json.loads((folder / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def write_record(folder: Path, fields: dict) -> None:
    """gateway.json, written whole (a reader never sees half of it), private."""
    temporary = folder / f".{RECORD_NAME}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(fields, out)
    os.replace(temporary, folder / RECORD_NAME)


def hold_directory(folder: Path, *, wait_s: float = 30.0):
    """The gateway's lock on its directory (one gateway per directory; a predecessor still exiting
    is waited for). The open file holds it: keep it for as long as the gateway runs."""
    held = open(folder / GATEWAY_LOCK, "a")
    os.fchmod(held.fileno(), 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return held
        except BlockingIOError:
            if time.monotonic() > deadline:
                held.close()
                raise NoUserGateway(f"Another gpusession gateway still holds {folder} after {wait_s:.0f} s.") from None
            time.sleep(0.1)
