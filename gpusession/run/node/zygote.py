"""The warm parent of rank processes on a node: torch imported, CUDA never touched, never runs
user code.

Its owner starts it (`python -c ...zygote._main()`: a clean process, not a fork of the Ray
worker, which Ray does not support): the node's host actor (nodehost.py), shared by every kernel
and every placement on the node, or, for a call with its own runtime_env, that call's worker
actor. Worker actors ask it for a fresh child per rank per attempt. A fork of a process that
already imported torch takes a few milliseconds where a new process pays ~3 s of `import torch`;
the child starts with nothing a previous call changed, and gives its GPU memory back by exiting.

Connections: the owner's control socket (a socketpair), and, when started with a socket path,
any number of worker actors of the node connecting to that Unix socket (in a directory only this
user can enter). On every connection:
  actor -> zygote: one byte b"F" with one file descriptor attached (SCM_RIGHTS): fork a child
                   that talks to the actor on that descriptor;
                   b"K" and a pid (8 bytes, big-endian): kill that child's process group, if it
                   is a child this connection asked for that has not been reaped yet. Only the
                   parent can kill by pid safely: once a child is reaped, its pid may be given to
                   any new process (pid_max is often 32768), and a late kill would hit that one;
                   b"U" with one file descriptor attached, then a length (4 bytes, big-endian) and
                   that many bytes of JSON {"account": name, "gpus": [...] or null, "role": "rank"
                   or "store"}: fork a child
                   that runs as that account (only a launcher, run as root, serves this; see
                   gpusession/launcher/);
  zygote -> actor: JSON lines: {"hello": pid}, {"forked": pid}, {"refused": why},
                   {"exited": pid, "code", "signal"}.
A connection that closes (its actor died) takes the children it asked for with it. The zygote
ends, killing every child, as soon as its owner's control socket closes (the owner died).

With a Gate (gpusession/launcher/gate.py: the same loop run as root) connections are kept only
from the service account, plain b"F" forks are refused, and each child becomes its account before
it runs anything; without one (every setup but `gpusession hub`) nothing here changes."""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from ...errors import LaunchRefused

PATH_ENV = "GPUSESSION_ZYGOTE_SYS_PATH"
FORK, KILL, FORK_AS = b"F", b"K", b"U"
LENGTH_BYTES = 4
PID_BYTES = 8
REAP_EVERY_S = 0.05
# What every rank needs, imported once here. Not Ray: a rank is not a Ray worker (see spec.py).
# torch._dynamo: DistributedDataParallel's constructor reads torch._dynamo.utils, and torch imports
# it lazily on that first touch: ~800 modules (sympy, mpmath), 2-6 s in every fresh rank, which
# was most of a warm gs.prepare_model call. Imported here it costs the parent once, and starts
# no thread (the fork stays safe).
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "cloudpickle", "psutil",
           "gpusession.run.rank.child", "gpusession.run.rank.process_group", "gpusession.run.spec", "gpusession.run.rank.context",
           "gpusession.run.store", "gpusession.run.rank.capture", "gpusession.cluster.netif", "gpusession.errors")


# ----- the zygote process ------------------------------------------------------------------------
def _serve(owner: socket.socket, listener: socket.socket | None, gate=None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the caller, not us
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from ..shipping import installed_top_level_names

    installed_top_level_names()  # read once here, not in every rank that pickles a result (~0.4 s each)
    asked: dict[socket.socket, set[int]] = {owner: set()}  # each connection: the children it asked for
    children: dict[int, socket.socket | None] = {}  # each child: the connection told when it ends
    # A child's exit wakes the loop at once (SIGCHLD writes to this socket), so the caller hears
    # of it without waiting out a poll; the select timeout stays as a fallback.
    global _wake_sockets
    _wake_sockets = socket.socketpair()
    wake = _wake_sockets[0]
    for sock in _wake_sockets:
        sock.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(_wake_sockets[1].fileno(), warn_on_full_buffer=False)
    _send(owner, {"hello": os.getpid()})
    try:
        while True:
            waiting = list(asked) + ([listener] if listener is not None else []) + [wake]
            readable, _, _ = select.select(waiting, [], [], REAP_EVERY_S)
            for sock in readable:
                if sock is wake:
                    _drain(wake)
                elif sock is listener:
                    _accept(listener, asked, gate)
                elif not _serve_request(sock, owner, listener, asked, children, gate):
                    if sock is owner:
                        return  # the owner is gone
                    _drop(sock, asked, children, gate)
            _reap(children, asked, gate)
    finally:
        for pid in children:
            _kill_group(pid)
        if gate is not None:
            gate.close()


_wake_sockets: tuple[socket.socket, socket.socket] = ()  # the zygote's SIGCHLD wakeup pair


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _accept(listener: socket.socket, asked: dict, gate=None) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    if gate is not None and not gate.accepts(conn):  # SO_PEERCRED: the service account only
        conn.close()
        return
    if _send(conn, {"hello": os.getpid()}):
        asked[conn] = set()
    else:
        conn.close()


def _serve_request(sock, owner, listener, asked: dict, children: dict, gate=None) -> bool:
    """Fork the child one request asks for; False when the connection closed."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1, 1)
    except OSError:
        return False
    if not data:
        return False
    if data == KILL:
        pid = _read_pid(sock)
        if pid is None:
            return False
        if pid in asked.get(sock, ()):  # unreaped (reaped ones leave `asked`): the pid is still its own
            _kill_group(pid)
            if gate is not None:
                gate.kill(pid)  # and whatever left its process group (setsid)
        return True
    request = _read_request(sock) if data == FORK_AS else None
    if data == FORK_AS and request is None:
        return False
    if not fds:
        return True
    plan = None
    if gate is not None:
        plan, why = gate.prepare(request) if request is not None else (
            None, "this launcher starts ranks only as a named account (a b'U' request)")
        if why:
            for fd in fds:
                os.close(fd)
            return _send(sock, {"refused": why})
    others = [s for s in asked if s is not None] + ([listener] if listener is not None else [])
    pid = _fork_child(others, fds[0], gate, plan)
    for fd in fds:
        os.close(fd)
    if gate is not None:
        gate.started(pid, plan)
    children[pid] = sock
    asked[sock].add(pid)
    return _send(sock, {"forked": pid})


def _read_request(sock: socket.socket) -> dict | None:
    try:
        raw = sock.recv(LENGTH_BYTES, socket.MSG_WAITALL)
        size = int.from_bytes(raw, "big") if len(raw) == LENGTH_BYTES else -1
        body = sock.recv(size, socket.MSG_WAITALL) if 0 <= size <= 65536 else b""
        request = json.loads(body)
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def _read_pid(sock: socket.socket) -> int | None:
    try:
        raw = sock.recv(PID_BYTES, socket.MSG_WAITALL)
    except OSError:
        return None
    return int.from_bytes(raw, "big") if len(raw) == PID_BYTES else None


def _drop(sock: socket.socket, asked: dict, children: dict, gate=None) -> None:
    """A worker actor's connection closed (the actor died): its ranks die too; they are still
    reaped here, with nobody left to tell."""
    for pid in asked.pop(sock, ()):
        _kill_group(pid)
        if gate is not None:
            gate.kill(pid)
        children[pid] = None
    sock.close()


def _fork_child(inherited: list[socket.socket], fd: int, gate=None, plan=None) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: a fresh rank process
        signal.set_wakeup_fd(-1)  # the zygote's SIGCHLD wakeup is not the rank's either
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in (*inherited, *_wake_sockets):  # the zygote's sockets are not the rank's business
            sock.close()
        os.setsid()  # its own process group: the actor kills the rank with every process it started
        _die_with_parent()
        _signals_as_a_fresh_python()
        if gate is not None:  # run as root: become the user first (launcher/gate.py), or run nothing
            gate.enter(plan, fd)
        from gpusession.run.rank import child

        child.main(fd)
    finally:
        os._exit(70)


def _signals_as_a_fresh_python() -> None:
    """A rank's signals as a Python that torchrun starts has them: nothing blocked, Ctrl-C's
    SIGINT raising KeyboardInterrupt, SIGTERM's default. Ray starts its processes with SIGINT
    blocked (so a terminal's Ctrl-C leaves the cluster up), the warm parent inherits that mask from
    the actor that started it and ignores SIGINT itself; a rank inherited both, so a SIGINT to it,
    or to any program it started, did nothing."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _reap(children: dict, asked: dict, gate=None) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if gate is not None:
            gate.ended(pid)  # before the actor hears of it: what the rank left is gone by then
        if conn is None or conn not in asked:
            continue
        asked[conn].discard(pid)
        code = os.waitstatus_to_exitcode(status)
        _send(conn, {"exited": pid, "code": code if code >= 0 else None, "signal": -code if code < 0 else None})


def _send(conn: socket.socket, message: dict) -> bool:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
        return True
    except OSError:  # the other end is gone; its connection is dropped at its next read
        return False


def _die_with_parent() -> None:
    """If the zygote dies (its actor was killed with the kernel), its ranks die with it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----- a handle on a zygote ------------------------------------------------------------------------
class Zygote:
    """A zygote this process started (`Zygote.start`, its owner) or connected to
    (`Zygote.connect`); forks rank processes on request and tells how they ended."""

    def __init__(self, control: socket.socket, process: subprocess.Popen | None) -> None:
        self.process = process  # None when connected to another owner's zygote
        self._control = control
        self._lock = threading.Lock()
        self._forked: queue.Queue = queue.Queue()
        self._exits: dict[int, tuple[int | None, int | None]] = {}
        self._exited = threading.Condition()
        self._hello = threading.Event()
        self.pid: int | None = None
        self._closed = False
        threading.Thread(target=self._read, name="gpusession-zygote-reader", daemon=True).start()

    @classmethod
    def start(cls, socket_path: str | None = None) -> "Zygote":
        """Start a zygote owned by this process; with socket_path, worker actors of this node
        may connect to it there too."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env[PATH_ENV] = json.dumps(sys.path)  # Ray's runtime_env may have added to it
        command = [sys.executable, "-c", "from gpusession.run.node.zygote import _main; _main()", str(theirs.fileno())]
        if socket_path:
            command.append(socket_path)
        process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                   cwd=os.getcwd())
        theirs.close()
        return cls(ours, process)

    @classmethod
    def connect(cls, socket_path: str, timeout_s: float) -> "Zygote":
        """Connect to the zygote listening at socket_path (it may still be starting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(socket_path)
                return cls(sock, None)
            except OSError:
                sock.close()
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"No warm parent of rank processes listens at {socket_path}.") from None
                time.sleep(0.05)

    def wait_ready(self, timeout_s: float) -> None:
        if not self._hello.wait(timeout_s):
            code = self.process.poll() if self.process is not None else None
            raise RuntimeError(
                "The warm parent of rank processes did not start"
                + (f" (it exited with {code})" if code is not None else f" within {timeout_s:.0f} s")
                + ": check that torch and gpusession import on this node."
            )

    def alive(self) -> bool:
        return not self._closed and (self.process is None or self.process.poll() is None)

    def fork(self, timeout_s: float = 10.0, *, account: str | None = None,
             gpus: tuple[str, ...] | None = None, role: str = "rank") -> tuple[int, Connection]:
        """A fresh child; with `account` (a launcher only: gpusession/launcher/) it runs as that
        Unix account, seeing only `gpus`' device files where that is enforced. LaunchRefused
        says why the launcher would not."""
        ours, theirs = socket.socketpair()
        with self._lock:
            if not self.alive():
                raise RuntimeError("The warm parent of rank processes is gone.")
            try:
                if account is None:
                    socket.send_fds(self._control, [FORK], [theirs.fileno()])
                else:
                    body = json.dumps({"account": account, "gpus": list(gpus) if gpus is not None else None,
                                       "role": role}).encode()
                    socket.send_fds(self._control, [FORK_AS], [theirs.fileno()])
                    self._control.sendall(len(body).to_bytes(LENGTH_BYTES, "big") + body)
            except OSError:
                self._closed = True  # it died; our reader may not have seen the EOF yet
                raise RuntimeError("The warm parent of rank processes is gone.") from None
            finally:
                theirs.close()
            try:
                pid = self._forked.get(timeout=timeout_s)
            except queue.Empty:
                raise RuntimeError(f"The warm parent did not fork a rank process within {timeout_s:.0f} s.") from None
        if isinstance(pid, str):
            ours.close()
            raise LaunchRefused(f"The launcher refused to start the rank: {pid}.")
        return pid, Connection(ours.detach())

    def exit_status(self, pid: int, timeout_s: float) -> tuple[int | None, int | None] | None:
        """(exit code, signal) of a forked process once reaped; None if not within timeout_s."""
        deadline = time.monotonic() + timeout_s
        with self._exited:
            while pid not in self._exits:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._exited.wait(left)
            return self._exits.pop(pid)

    def kill(self, pid: int) -> None:
        """Kill the rank `pid` that this connection forked, and every process it started, unless
        it has already ended: the warm parent, its parent, does it (see the protocol above)."""
        with self._lock:
            try:
                self._control.sendall(KILL + pid.to_bytes(PID_BYTES, "big"))
            except OSError:  # the warm parent is gone, and its children with it (PR_SET_PDEATHSIG)
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._control.shutdown(socket.SHUT_RDWR)  # wakes our reader thread; the zygote sees EOF
        except OSError:
            pass
        try:
            self._control.close()
        except OSError:
            pass
        if self.process is None:
            return
        try:
            self.process.wait(2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self._control.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self._dispatch(json.loads(line))
        self._closed = True
        with self._exited:
            self._exited.notify_all()

    def _dispatch(self, message: dict) -> None:
        if "hello" in message:
            self.pid = message["hello"]
            self._hello.set()
        elif "forked" in message:
            self._forked.put(message["forked"])
        elif "refused" in message:
            self._forked.put(str(message["refused"]))
        elif "exited" in message:
            with self._exited:
                self._exits[message["exited"]] = (message.get("code"), message.get("signal"))
                self._exited.notify_all()


def _main() -> None:
    sys.path[:] = json.loads(os.environ.pop(PATH_ENV, "[]")) or sys.path
    owner = socket.socket(fileno=int(sys.argv[1]))
    listener = None
    if len(sys.argv) > 2:  # listen before the slow imports: an actor may connect and wait for hello
        path = sys.argv[2]
        if os.path.exists(path):  # left by a zygote of the same owner that died
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
    try:
        _serve(owner, listener)
    finally:
        if listener is not None:
            listener.close()
            try:
                os.unlink(sys.argv[2])
            except OSError:
                pass


if __name__ == "__main__":
    _main()
