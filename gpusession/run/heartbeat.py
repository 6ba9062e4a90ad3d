"""Heartbeats between each rank's worker actor and the run controller, apart from Ray.

Ray notices a dead node only by its own health checks (about 15 s for a host whose processes
died, about 60 s for one that went silent), and a surviving rank's "connection closed by peer"
often reaches the caller before Ray reports the dead actor. So each worker actor serves a plain
TCP heartbeat (one byte every BEAT_EVERY_S) and the controller holds one connection per rank
while an attempt runs:
- the connection closes (the actor's process, or every process of its host, died): the kernel
  says so at once;
- nothing arrives for `silence_s` (a host that went silent: link down, frozen): lost then.
No Ray, no torch here: the actor side is a thread, the controller side a thread and a list.
"""
from __future__ import annotations

import os
import secrets
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Hashable

SILENCE_ENV = "GPUSESSION_HOST_SILENCE_S"
DEFAULT_SILENCE_S = 5.0
MIN_SILENCE_S, MAX_SILENCE_S = 1.0, 600.0
BEAT_EVERY_S = 0.25  # silence_s >= 4 beats: one late beat on a loaded node is never a loss
CONNECT_TIMEOUT_S = 2.0
BEAT = b"."


def silence_timeout() -> float:
    """How long a rank's actor may stay silent before its host counts as lost (seconds):
    GPUSESSION_HOST_SILENCE_S, default 5. Raises ValueError naming the variable if it is bad."""
    raw = os.environ.get(SILENCE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SILENCE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not MIN_SILENCE_S <= value <= MAX_SILENCE_S:  # also false for nan
        raise ValueError(
            f"{SILENCE_ENV} must be a number of seconds from {MIN_SILENCE_S:g} to {MAX_SILENCE_S:g} (how long a "
            f"silent host may take to count as lost); got {raw!r}. Unset it for the default "
            f"{DEFAULT_SILENCE_S:g} s."
        )
    return value


# ----- the worker actor's side ----------------------------------------------------------------------
AUTH_TIMEOUT_S = 2.0  # a connection must send the token within this, or it is closed
MAX_PENDING = 64  # connections waiting for their token at once; past it the oldest is closed


class BeatServer:
    """Listens on the node's Ray IP; beats on every connection that opened with this server's
    token (the controller gets it with the port, from the actor's info through Ray), until the
    connection closes. Any other connection is closed: at once with a wrong token, within
    AUTH_TIMEOUT_S without one, the oldest first past MAX_PENDING waiting. One thread serves them
    all, so a local account that opens connections by the thousand costs the actor no thread and
    at most MAX_PENDING descriptors, and cannot end the heartbeat of the runs on it."""

    def __init__(self, address: str) -> None:
        self.token = secrets.token_hex(16)
        self._listener = socket.create_server((address, 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._serve, name="gpusession-heartbeat", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        pending: dict[socket.socket, tuple[float, bytes]] = {}  # insertion order: oldest first
        beating: set[socket.socket] = set()
        expected = self.token.encode()
        next_beat = time.monotonic()
        try:
            while not self._closed:
                for key, _ in selector.select(timeout=max(0.0, next_beat - time.monotonic())):
                    conn = key.fileobj
                    if conn is self._listener:
                        self._accept(selector, pending)
                    elif conn in pending:
                        deadline, got = pending[conn]
                        more = _recv(conn, len(expected) - len(got))
                        if more is None:
                            continue
                        got += more
                        if got == expected:
                            del pending[conn]
                            beating.add(conn)
                        elif more and expected.startswith(got):
                            pending[conn] = (deadline, got)  # the rest of the token is on its way
                        else:  # a wrong token, or closed before sending it
                            del pending[conn]
                            _close(selector, conn)
                    elif _recv(conn, 4096) == b"":  # the controller closed it (the attempt ended)
                        beating.discard(conn)
                        _close(selector, conn)
                now = time.monotonic()
                for conn, (deadline, _) in list(pending.items()):
                    if now >= deadline:
                        del pending[conn]
                        _close(selector, conn)
                if now >= next_beat:
                    for conn in list(beating):
                        try:
                            conn.send(BEAT)
                        except (BlockingIOError, InterruptedError):
                            pass  # its buffer is full: a controller that stopped reading hears silence
                        except OSError:
                            beating.discard(conn)
                            _close(selector, conn)
                    next_beat = now + BEAT_EVERY_S
        finally:
            for conn in [*pending, *beating]:
                _close(selector, conn)
            selector.close()

    def _accept(self, selector, pending: dict) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # out of descriptors for a moment: the next round tries again
            time.sleep(0.05)
            return
        conn.setblocking(False)
        if len(pending) >= MAX_PENDING:
            oldest = next(iter(pending))
            del pending[oldest]
            _close(selector, oldest)
        pending[conn] = (time.monotonic() + AUTH_TIMEOUT_S, b"")
        selector.register(conn, selectors.EVENT_READ)


def _recv(conn: socket.socket, size: int) -> bytes | None:
    """Up to size bytes; b"" once the peer closed or failed; None: nothing to read after all."""
    try:
        return conn.recv(max(1, size))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def _close(selector, conn: socket.socket) -> None:
    try:
        selector.unregister(conn)
    except (KeyError, ValueError):
        pass
    conn.close()


# ----- the controller's side -------------------------------------------------------------------------
@dataclass(frozen=True)
class Loss:
    key: Hashable  # what the caller watches through this connection (a rank)
    how: str  # "its processes stopped (connection closed)", "silent for 5.0 s", ...
    at: float  # time.time() when it was noticed


class BeatMonitor:
    """Connections to the actors of one attempt; losses are collected by a thread and taken
    with `take_losses()`. Close it when the attempt ends."""

    def __init__(self, targets: dict[Hashable, tuple], silence_s: float) -> None:
        """targets: what to watch -> (address, port, token) of its actor's BeatServer."""
        self.silence_s = silence_s
        self._lock = threading.Lock()
        self._losses: list[Loss] = []
        self._conns: dict[socket.socket, Hashable] = {}
        self._last: dict[socket.socket, float] = {}
        self._closed = False
        # close() writes here to wake the thread from its select at once: a join that waited out
        # the select's timeout would add up to BEAT_EVERY_S to every call's end.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self.unwatched: dict[Hashable, str] = {}  # could not connect: left to Ray's own detection
        for key, (address, port, token) in targets.items():
            try:
                conn = socket.create_connection((address, port), timeout=min(CONNECT_TIMEOUT_S, silence_s))
                conn.sendall(token.encode())
                conn.setblocking(False)
            except OSError as exc:
                # A firewall between the caller and a node must not fail runs that Ray can run:
                # such a rank is watched by Ray alone (a worker already dead is Ray's to report too).
                self.unwatched[key] = f"{address}:{port}: {exc.strerror or exc}"
                continue
            self._conns[conn] = key
            self._last[conn] = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="gpusession-heartbeat-monitor", daemon=True)
        self._thread.start()

    def take_losses(self) -> list[Loss]:
        with self._lock:
            losses, self._losses = self._losses, []
        return losses

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_writer.send(b"x")
        except OSError:  # closed already
            pass
        self._thread.join(timeout=1.0)
        for conn in list(self._conns):
            conn.close()
        self._conns.clear()
        self._wake_writer.close()
        self._wake_reader.close()

    def _lost(self, key: Hashable, how: str) -> None:
        with self._lock:
            self._losses.append(Loss(key, how, time.time()))

    def _drop(self, conn: socket.socket, how: str) -> None:
        key = self._conns.pop(conn)
        self._last.pop(conn, None)
        conn.close()
        self._lost(key, how)

    def _watch(self) -> None:
        while not self._closed and self._conns:
            readable, _, _ = select.select([*self._conns, self._wake_reader], [], [], BEAT_EVERY_S)
            now = time.monotonic()
            for conn in readable:
                if conn is self._wake_reader:  # close() was called
                    return
                try:
                    data = conn.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    self._drop(conn, f"its processes stopped ({exc.strerror or exc})")
                    continue
                if not data:
                    self._drop(conn, "its processes stopped (connection closed)")
                else:
                    self._last[conn] = now
            for conn, last in list(self._last.items()):
                if now - last >= self.silence_s:
                    self._drop(conn, f"silent for {now - last:.1f} s")
