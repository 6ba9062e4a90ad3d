"""One account cannot shut the gateway for the others (audit41 F2, F3): a real GatewayServer on a
real Unix socket, callers as real accounts, a server process out of descriptors, a hello that
dribbles or declares a terabyte. No Ray: these never reach a session's work."""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from gpusession.gateway.client import connect
from gpusession.gateway.server import MAX_CONNECTIONS_PER_UID, GatewayServer

from ..accounts import add_account, remove_accounts
from ..conftest import ROOT
from .gateway_echo import echo

CALLER_PYTHON = "/usr/bin/python3"  # the callers need the standard library and this checkout alone
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to other accounts needs root (CI runs as root)")

@pytest.fixture
def folder():
    where = Path(tempfile.mkdtemp(prefix="gsgwlim-", dir="/tmp"))
    os.chmod(where, 0o755)  # every account may reach the socket, as under the hub
    yield where
    shutil.rmtree(where)


@pytest.fixture
def serving(folder):
    server = GatewayServer(folder / "gateway.sock", {"run": echo}, hello_timeout_s=2.0).start()
    yield server
    server.stop()


@pytest.fixture
def accounts():
    prefix = f"gsf2{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}a", f"{prefix}b"]
    try:
        for name in names:
            add_account(name, system=False)
        yield names
    finally:
        remove_accounts(names)


def _account_process(name: str, code: str, **popen) -> subprocess.Popen:
    import pwd

    account = pwd.getpwnam(name)
    return subprocess.Popen([CALLER_PYTHON, "-B", "-c", code], text=True, user=account.pw_uid, group=account.pw_gid,
                            extra_groups=[], cwd="/", env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _all_of(sock: socket.socket) -> bytes:
    """What the server sent before it closed (a Unix socket closed with unread bytes of ours in
    it ends with ECONNRESET after its data, not with an empty read)."""
    sock.settimeout(30)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _served(path: Path, timeout_s: float = 10.0) -> str:
    """Connect, be welcomed, be told who: the user the gateway serves on this connection."""
    conn, welcome = connect("run", str(path), timeout_s=timeout_s)
    try:
        conn.sock.settimeout(timeout_s)
        return conn.receive().get("user")
    finally:
        conn.close()


def test_an_account_past_its_connections_is_refused_while_another_account_is_served(serving, accounts):
    crowd, other = accounts
    holder = _account_process(crowd, f"""
import json, sys
from gpusession.gateway.client import GatewayRefused, connect
held, refused = [], []
for _ in range({MAX_CONNECTIONS_PER_UID + 10}):
    try:
        held.append(connect("run", {str(serving.path)!r}, timeout_s=10))
    except GatewayRefused as exc:
        refused.append(str(exc))
print(json.dumps({{"held": len(held), "refused": refused}}), flush=True)
sys.stdin.read()  # holds them until the test closes stdin
""", stdin=subprocess.PIPE)
    try:
        line = holder.stdout.readline()
        assert line, holder.stderr.read()[-2000:]
        seen = json.loads(line)
        assert seen["held"] == MAX_CONNECTIONS_PER_UID and len(seen["refused"]) == 10
        assert f"at most {MAX_CONNECTIONS_PER_UID}" in seen["refused"][0]
        served = _account_process(other, f"""
from gpusession.gateway.client import connect
conn, welcome = connect("run", {str(serving.path)!r}, timeout_s=10)
conn.sock.settimeout(10)
print(welcome["user"], conn.receive().get("user"))
""")
        out, err = served.communicate(timeout=60)
        assert served.returncode == 0, err[-2000:]
        assert out.split() == [other, other]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_hello_dribbled_a_byte_a_second_is_refused_at_its_deadline_while_others_are_served(serving):
    hello = json.dumps({"kind": "hello", "version": 1, "session": "run", "payload": 0}).encode()
    raw = struct.pack(">Q", len(hello)) + hello
    dribbler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dribbler.connect(str(serving.path))
    stop = threading.Event()

    def dribble():
        for byte in raw:
            try:
                dribbler.send(bytes([byte]))
            except OSError:
                return
            if stop.wait(1.0):
                return

    began = time.monotonic()
    threading.Thread(target=dribble, daemon=True).start()
    try:
        assert _served(serving.path) == "root"  # served while the dribbler holds its connection
        answer = _all_of(dribbler)
        ended = time.monotonic() - began
    finally:
        stop.set()
        dribbler.close()
    assert ended < 2.0 + 1.5, f"the dribbled hello held its connection {ended:.1f} s (deadline 2 s)"
    assert b'"refused"' in answer and b"within 2 s" in answer
    assert _served(serving.path) == "root"


# ----- a server process of its own: its descriptors and its memory ---------------------------------
@pytest.fixture
def server_process(folder):
    started = []

    def start(nofile: int = 0) -> tuple[subprocess.Popen, Path]:
        path = folder / "own.sock"
        log = open(folder / "server.log", "w+")
        proc = subprocess.Popen([sys.executable, "-B", "-m", "tests.integration.gateway_echo", str(path), str(nofile)],
                                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
        started.append((proc, log))
        assert proc.stdout.readline().strip() == "ready", (folder / "server.log").read_text()[-2000:]
        return proc, path

    yield start
    for proc, log in started:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _logged(folder: Path, text: str, timeout_s: float = 20.0) -> str:
    """The server's log once it says `text` (it is written as the server gets there)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = (folder / "server.log").read_text()
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"the server never logged {text!r}:\n{log[-3000:]}")


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_server_out_of_descriptors_accepts_again_once_they_are_free(folder, server_process):
    proc, path = server_process(nofile=48)
    held = []
    try:
        for _ in range(60):  # past its descriptors; the rest wait in the listen backlog
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            held.append(sock)
        deadline = time.monotonic() + 20
        while len(os.listdir(f"/proc/{proc.pid}/fd")) < 48:
            assert time.monotonic() < deadline, "the server never reached its descriptor limit"
            time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()
    assert _served(path) == "root"
    log = _logged(folder, "accepts connections again")
    assert "could not accept a connection (OSError: [Errno 24] Too many open files)" in log
    assert proc.poll() is None


def test_a_hello_declaring_a_terabyte_is_refused_and_a_call_declaring_gigabytes_allocates_only_what_comes(
        folder, server_process):
    proc, path = server_process()
    before = _peak_rss(proc.pid)
    hello = json.dumps({"kind": "hello", "version": 1, "session": "run", "payload": 1}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(struct.pack(">Q", len(hello)) + hello + struct.pack(">Q", 1 << 40) + b"x" * 1000)
        answer = _all_of(sock)
    assert b'"refused"' in answer and b"payload count of 1" in answer

    conn, _ = connect("run", str(path), timeout_s=30)  # welcomed: a run session takes big frames
    try:
        conn.sock.settimeout(30)
        assert conn.receive().get("user") == "root"
        call = json.dumps({"kind": "run", "payload": 1}).encode()
        conn.sock.sendall(struct.pack(">Q", len(call)) + call + struct.pack(">Q", 2 << 30) + b"y" * (1 << 20))
    finally:
        conn.close()  # in the middle of its 2 GiB: the server reads the end and forgets the call
    _logged(folder, "in the middle of a message")
    grown = _peak_rss(proc.pid) - before
    assert grown < 64 * 2**20, f"the server's peak memory grew {grown / 2**20:.0f} MiB"
    assert _served(path) == "root"
