"""The warm parent of rank processes on a node: torch imported, CUDA never touched, never runs
user code.

A worker actor starts one (`python -c ...zygote._main()`: a clean process, not a fork of the
Ray worker, which Ray does not support) and asks it for a fresh child per rank per attempt. A
fork of a process that already imported torch takes a few milliseconds where a new process pays
~3 s of `import torch`; the child starts with nothing a previous call changed, and gives its GPU
memory back by exiting.

Protocol on the control socket (a socketpair; the actor holds the other end):
  actor -> zygote: one byte b"F" with one file descriptor attached (SCM_RIGHTS): fork a child
                   that talks to the actor on that descriptor;
  zygote -> actor: JSON lines: {"hello": pid}, {"forked": pid}, {"exited": pid, "code", "signal"}.
The zygote ends, killing its children, as soon as the control socket closes (the actor died).
"""
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

PATH_ENV = "GPUSESSION_ZYGOTE_SYS_PATH"
REAP_EVERY_S = 0.05
# What every rank needs, imported once here. Not Ray: a rank is not a Ray worker (see spec.py).
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "cloudpickle", "psutil", "gpusession.run.child",
           "gpusession.run.spec", "gpusession.run.context", "gpusession.capture", "gpusession.cluster.netif",
           "gpusession.errors")


# ----- the zygote process ------------------------------------------------------------------------
def _serve(control: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the caller, not us
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _send(control, {"hello": os.getpid()})
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([control], [], [], REAP_EVERY_S)
            if readable:
                data, fds, _, _ = socket.recv_fds(control, 1, 1)
                if not data:
                    return  # the actor is gone
                pid = _fork_child(control, fds[0])
                os.close(fds[0])
                children.add(pid)
                _send(control, {"forked": pid})
            _reap(control, children)
    finally:
        for pid in children:
            _kill_group(pid)


def _fork_child(control: socket.socket, fd: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: a fresh rank process
        control.close()
        os.setsid()  # its own process group: the actor kills the rank with every process it started
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from gpusession.run import child

        child.main(fd)
    finally:
        os._exit(70)


def _reap(control: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        _send(control, {"exited": pid, "code": code if code >= 0 else None,
                        "signal": -code if code < 0 else None})


def _send(control: socket.socket, message: dict) -> None:
    control.sendall((json.dumps(message) + "\n").encode())


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


# ----- the actor's handle on its zygote ------------------------------------------------------------
class Zygote:
    """Started by a worker actor; forks rank processes on request and tells how they ended."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env[PATH_ENV] = json.dumps(sys.path)  # Ray's runtime_env may have added to it
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from gpusession.run.zygote import _main; _main()", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, cwd=os.getcwd(),
        )
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()
        self._forked: queue.Queue = queue.Queue()
        self._exits: dict[int, tuple[int | None, int | None]] = {}
        self._exited = threading.Condition()
        self._hello = threading.Event()
        self._closed = False
        threading.Thread(target=self._read, name="gpusession-zygote-reader", daemon=True).start()

    def wait_ready(self, timeout_s: float) -> None:
        if not self._hello.wait(timeout_s):
            code = self.process.poll()
            raise RuntimeError(
                "The warm parent of rank processes did not start"
                + (f" (it exited with {code})" if code is not None else f" within {timeout_s:.0f} s")
                + ": check that torch and gpusession import on this node."
            )

    def alive(self) -> bool:
        return not self._closed and self.process.poll() is None

    def fork(self, timeout_s: float = 10.0) -> tuple[int, Connection]:
        ours, theirs = socket.socketpair()
        with self._lock:
            if self._closed or self.process.poll() is not None:
                raise RuntimeError("The warm parent of rank processes is gone.")
            socket.send_fds(self._control, [b"F"], [theirs.fileno()])
            theirs.close()
            try:
                pid = self._forked.get(timeout=timeout_s)
            except queue.Empty:
                raise RuntimeError(f"The warm parent did not fork a rank process within {timeout_s:.0f} s.") from None
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

    @staticmethod
    def kill(pid: int) -> None:
        _kill_group(pid)

    def close(self) -> None:
        self._closed = True
        try:
            self._control.close()
        except OSError:
            pass
        try:
            self.process.wait(2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()

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
            self._hello.set()
        elif "forked" in message:
            self._forked.put(message["forked"])
        elif "exited" in message:
            with self._exited:
                self._exits[message["exited"]] = (message.get("code"), message.get("signal"))
                self._exited.notify_all()


def _main() -> None:
    sys.path[:] = json.loads(os.environ.pop(PATH_ENV, "[]")) or sys.path
    control = socket.socket(fileno=int(sys.argv[-1]))
    _serve(control)


if __name__ == "__main__":
    _main()
