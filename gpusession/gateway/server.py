"""The gateway's side: a Unix socket, one thread per connection, the peer named by the kernel
(peer.py), the connection handed to the handler of the session it asked for. The hub's gateway
(run by the service) lets any local account connect; a user's own gateway (usergateway.py,
`only_uid`) lets only its own account in: its socket lies in a directory only that account may
enter, and a peer of any other uid is refused all the same.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .frames import Closed, Connection, FrameError, Message
from .peer import Peer, peer_of
from .kinds import Kind

log = logging.getLogger("gpusession.gateway")
VERSION = 1
HELLO_TIMEOUT_S = 10.0
MAX_CONNECTIONS_PER_UID = 64  # a kernel holds one or two; a loop that opens thousands is refused


@dataclass(frozen=True)
class Caller:
    """A connected peer as the service sees it: who, and whether the configuration names it admin."""

    peer: Peer
    admin: bool

    @property
    def user(self) -> str:
        return self.peer.name


Handler = Callable[[Connection, Caller, Message], None]


def refusal(peer: Peer, session: object, sessions: dict, open_of_uid: int = 0,
            only_uid: int | None = None) -> str | None:
    """PURE: why this hello is refused, or None (`open_of_uid`: this uid's other open connections;
    `only_uid`: the one account a user's own gateway serves)."""
    if only_uid is not None and peer.uid != only_uid:
        return (f"this gpusession gateway serves uid {only_uid} alone (it is that user's own); uid {peer.uid} "
                "may not use it.")
    if not peer.name:
        return f"uid {peer.uid} has no account name on this machine; the gateway serves named accounts only."
    if open_of_uid >= MAX_CONNECTIONS_PER_UID:
        return (f"{peer.name} has {open_of_uid} connections to the gateway open already (at most "
                f"{MAX_CONNECTIONS_PER_UID}); close some (restart idle kernels) and try again.")
    if session not in sessions:
        return f"unknown session {str(session)[:40]!r}; the gateway offers {', '.join(sorted(sessions))}."
    return None


class GatewayServer:
    """Listens at `path` until stop(); `sessions` maps a session name to its handler."""

    def __init__(self, path: str | Path, sessions: dict[str, Handler], *, admins: frozenset[str] = frozenset(),
                 only_uid: int | None = None) -> None:
        self.path = Path(path)
        self.sessions = dict(sessions)
        self.admins = frozenset(admins)
        self.only_uid = only_uid
        self.last_active = time.monotonic()  # when a connection last opened or closed
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._connections: set[Connection] = set()
        self._open_by_uid: dict[int, int] = {}
        self._lock = threading.Lock()

    def start(self) -> "GatewayServer":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        listener.bind(str(self.path))
        # the hub's: any local account may knock, who it is comes from the kernel; a user's own: only its account
        os.chmod(self.path, 0o666 if self.only_uid is None else 0o600)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept_forever, name="gpusession-gateway", daemon=True).start()
        return self

    def quiet_since(self) -> float | None:
        """When the last connection closed (time.monotonic()), or None while one is open."""
        with self._lock:
            return None if self._connections else self.last_active

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
            self.last_active = time.monotonic()
        counted = None
        try:
            caller, hello = self._greet(conn, sock)
            if caller is not None:
                counted = caller.peer.uid
                self.sessions[hello.get("session")](conn, caller, hello)
        except (Closed, FrameError, OSError) as exc:
            log.info("gateway connection ended: %s", exc)
        except Exception:
            log.exception("gateway handler failed")
        finally:
            with self._lock:
                self._connections.discard(conn)
                self.last_active = time.monotonic()
                if counted is not None:
                    self._open_by_uid[counted] -= 1
            conn.close()

    def _greet(self, conn: Connection, sock: socket.socket) -> tuple[Caller | None, Message]:
        peer = peer_of(sock)
        sock.settimeout(HELLO_TIMEOUT_S)
        hello = conn.receive()
        sock.settimeout(None)
        if hello.kind != Kind.HELLO or hello.get("version") != VERSION:
            conn.send(Kind.REFUSED, message=f"expected a version {VERSION} hello first; got {hello.kind[:40]!r}")
            return None, hello
        with self._lock:
            problem = refusal(peer, hello.get("session"), self.sessions, self._open_by_uid.get(peer.uid, 0),
                              self.only_uid)
            if not problem:
                self._open_by_uid[peer.uid] = self._open_by_uid.get(peer.uid, 0) + 1
        if problem:
            conn.send(Kind.REFUSED, message=problem)
            return None, hello
        caller = Caller(peer, admin=peer.name in self.admins)
        try:
            conn.send(Kind.WELCOME, version=VERSION, user=caller.user, admin=caller.admin)
        except OSError:
            with self._lock:
                self._open_by_uid[peer.uid] -= 1
            raise
        return caller, hello
