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

One account cannot shut the gateway for the others: its uid is read from the kernel as the
connection is accepted, and past MAX_CONNECTIONS_PER_UID open ones (hello or not) the next is
refused at once, before a thread starts for it. The hello must come whole within
HELLO_TIMEOUT_S and be small (HELLO_LIMITS: no payload frames); a broker session's messages are
small too (BROKER_LIMITS). Whatever goes wrong in accepting (out of descriptors, out of threads)
is logged and the accepting goes on, a little later; only stop() ends it.
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

from .frames import Closed, Connection, FrameError, Limits, Message
from .peer import UCRED, Peer, peer_of
from .kinds import Kind

log = logging.getLogger("gpusession.gateway")
VERSION = 1
HELLO_TIMEOUT_S = 10.0
MAX_CONNECTIONS_PER_UID = 64  # a kernel holds one or two; a loop that opens thousands is refused
HELLO_LIMITS = Limits(header=4096, payload_frames=0, frame=0)
BROKER_LIMITS = Limits(header=256 * 1024, payload_frames=0, frame=0)  # a call is at most 64 KB (brokercalls)
SESSION_LIMITS = {"broker": BROKER_LIMITS}  # any other session (run): frames.Limits() (big calls are its job)
ACCEPT_BACKOFF_S = 0.1  # after accept() or a thread's start failed (descriptors, threads, memory)


@dataclass(frozen=True)
class Caller:
    """A connected peer as the service sees it: who, and whether the configuration names it admin."""

    peer: Peer
    admin: bool

    @property
    def user(self) -> str:
        return self.peer.name


Handler = Callable[[Connection, Caller, Message], None]


def crowding(uid: int, open_of_uid: int) -> str | None:
    """PURE: why a new connection of `uid` is refused as it is accepted (`open_of_uid`: its
    connections already open), or None."""
    if open_of_uid >= MAX_CONNECTIONS_PER_UID:
        return (f"uid {uid} has {open_of_uid} connections to the gateway open already (at most "
                f"{MAX_CONNECTIONS_PER_UID}); close some (restart idle kernels) and try again.")
    return None


def refusal(peer: Peer, session: object, sessions: dict, only_uid: int | None = None) -> str | None:
    """PURE: why this hello is refused, or None (`only_uid`: the one account a user's own gateway
    serves)."""
    if only_uid is not None and peer.uid != only_uid:
        return (f"this gpusession gateway serves uid {only_uid} alone (it is that user's own); uid {peer.uid} "
                "may not use it.")
    if not peer.name:
        return f"uid {peer.uid} has no account name on this machine; the gateway serves named accounts only."
    if session not in sessions:
        return f"unknown session {str(session)[:40]!r}; the gateway offers {', '.join(sorted(sessions))}."
    return None


class GatewayServer:
    """Listens at `path` until stop(); `sessions` maps a session name to its handler."""

    def __init__(self, path: str | Path, sessions: dict[str, Handler], *, admins: frozenset[str] = frozenset(),
                 only_uid: int | None = None, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.hello_timeout_s = hello_timeout_s
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
        failing = False  # logged once per streak of failures, not every ACCEPT_BACKOFF_S
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
                self._admit(sock)
                if failing:
                    log.warning("the gateway accepts connections again")
                failing = False
            except Exception as exc:  # noqa: BLE001 - EMFILE, ENFILE, ENOMEM, no thread: go on
                if self._stopped.is_set():
                    return
                if not failing:
                    log.warning("the gateway could not accept a connection (%s: %s); it retries every %.1f s",
                                type(exc).__name__, exc, ACCEPT_BACKOFF_S)
                failing = True
                self._stopped.wait(ACCEPT_BACKOFF_S)

    def _admit(self, sock: socket.socket) -> None:
        """A connection just accepted: refused at once when its uid has too many open, else counted
        and served by a thread of its own (until it closes)."""
        try:
            uid = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))[1]
            with self._lock:
                crowded = crowding(uid, self._open_by_uid.get(uid, 0))
                if not crowded:
                    self._open_by_uid[uid] = self._open_by_uid.get(uid, 0) + 1
                    self._connections.add(conn := Connection(sock, HELLO_LIMITS))
                    self.last_active = time.monotonic()
        except BaseException:
            sock.close()
            raise
        if crowded:
            _refuse_now(sock, crowded)
            return
        try:
            threading.Thread(target=self._serve, args=(conn, uid), name="gpusession-gateway-conn", daemon=True).start()
        except BaseException:
            self._forget(conn, uid)
            raise

    def _forget(self, conn: Connection, uid: int) -> None:
        with self._lock:
            self._connections.discard(conn)
            self.last_active = time.monotonic()
            self._open_by_uid[uid] -= 1
            if not self._open_by_uid[uid]:
                del self._open_by_uid[uid]
        conn.close()

    def _serve(self, conn: Connection, uid: int) -> None:
        try:
            caller, hello = self._greet(conn)
            if caller is not None:
                self.sessions[hello.get("session")](conn, caller, hello)
        except (Closed, FrameError, OSError) as exc:
            log.info("gateway connection ended: %s", exc)
        except Exception:
            log.exception("gateway handler failed")
        finally:
            self._forget(conn, uid)

    def _greet(self, conn: Connection) -> tuple[Caller | None, Message]:
        """The hello, whole within hello_timeout_s and within HELLO_LIMITS (else a refusal, and
        the connection ends), and its answer; the caller, None when refused."""
        peer = peer_of(conn.sock)
        conn.deadline = time.monotonic() + self.hello_timeout_s
        try:
            hello = conn.receive()
        except (FrameError, TimeoutError) as exc:
            conn.sock.settimeout(1.0)  # a refusal the peer may never read holds nothing up
            conn.send(Kind.REFUSED, message=f"expected a version {VERSION} hello (at most {HELLO_LIMITS.header} bytes, "
                                            f"no payload) within {self.hello_timeout_s:g} s: {exc}")
            raise
        conn.deadline = None
        conn.sock.settimeout(None)
        if hello.kind != Kind.HELLO or hello.get("version") != VERSION:
            conn.send(Kind.REFUSED, message=f"expected a version {VERSION} hello first; got {hello.kind[:40]!r}")
            return None, hello
        problem = refusal(peer, hello.get("session"), self.sessions, self.only_uid)
        if problem:
            conn.send(Kind.REFUSED, message=problem)
            return None, hello
        caller = Caller(peer, admin=peer.name in self.admins)
        conn.limits = SESSION_LIMITS.get(hello.get("session"), Limits())
        conn.send(Kind.WELCOME, version=VERSION, user=caller.user, admin=caller.admin)
        return caller, hello


def _refuse_now(sock: socket.socket, message: str) -> None:
    """Say why, if the socket takes it at once, and close it (nothing waits on this peer)."""
    try:
        sock.setblocking(False)
        Connection(sock).send(Kind.REFUSED, message=message)
    except OSError:
        pass
    finally:
        sock.close()
