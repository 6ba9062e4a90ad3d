"""The gateway's side, run by the service: a Unix socket that any local account may connect to,
one thread per connection, the peer named by the kernel (peer.py), the connection handed to
the handler of the session it asked for.

Every connection begins with the client's hello:
    client -> {"kind": "hello", "version": 1, "session": "broker" | "run"}
    server -> {"kind": "welcome", "version": 1, "user": "ann", "admin": false}
              or {"kind": "refused", "message": "..."} and the connection closes.
Then the session's handler owns the connection until either side closes it. A handler never
unpickles what the peer sent.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .frames import Closed, Connection, FrameError, Message
from .peer import Peer, peer_of

log = logging.getLogger("gpusession.gateway")
VERSION = 1
HELLO_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Caller:
    """A connected peer as the service sees it: who, and whether the configuration names it admin."""

    peer: Peer
    admin: bool

    @property
    def user(self) -> str:
        return self.peer.name


Handler = Callable[[Connection, Caller, Message], None]


def refusal(peer: Peer, session: object, sessions: dict) -> str | None:
    """PURE: why this hello is refused, or None."""
    if not peer.name:
        return f"uid {peer.uid} has no account name on this machine; the gateway serves named accounts only."
    if session not in sessions:
        return f"unknown session {str(session)[:40]!r}; the gateway offers {', '.join(sorted(sessions))}."
    return None


class GatewayServer:
    """Listens at `path` until stop(); `sessions` maps a session name to its handler."""

    def __init__(self, path: str | Path, sessions: dict[str, Handler], *, admins: frozenset[str] = frozenset()) -> None:
        self.path = Path(path)
        self.sessions = dict(sessions)
        self.admins = frozenset(admins)
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()

    def start(self) -> "GatewayServer":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # any local account may knock; who it is comes from the kernel
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept_forever, name="gpusession-gateway", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _accept_forever(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name="gpusession-gateway-conn", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = Connection(sock)
        with self._lock:
            self._connections.add(conn)
        try:
            caller, hello = self._greet(conn, sock)
            if caller is not None:
                self.sessions[hello.get("session")](conn, caller, hello)
        except (Closed, FrameError, OSError) as exc:
            log.info("gateway connection ended: %s", exc)
        except Exception:
            log.exception("gateway handler failed")
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _greet(self, conn: Connection, sock: socket.socket) -> tuple[Caller | None, Message]:
        peer = peer_of(sock)
        sock.settimeout(HELLO_TIMEOUT_S)
        hello = conn.receive()
        sock.settimeout(None)
        if hello.kind != "hello" or hello.get("version") != VERSION:
            conn.send("refused", message=f"expected a version {VERSION} hello first; got {hello.kind[:40]!r}")
            return None, hello
        problem = refusal(peer, hello.get("session"), self.sessions)
        if problem:
            conn.send("refused", message=problem)
            return None, hello
        caller = Caller(peer, admin=peer.name in self.admins)
        conn.send("welcome", version=VERSION, user=caller.user, admin=caller.admin)
        return caller, hello
