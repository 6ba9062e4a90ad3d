"""How gateway messages travel over a stream socket: never a pickle in either direction.

A frame is a 4-byte big-endian length and that many bytes. A message is one frame of JSON (an
object with a string "kind", one of `kinds.Kind`), followed by `payload` raw frames when its JSON says
`"payload": N` (a pickled call, a pickled result: bytes the service relays and never looks
inside). Anything else is FrameError, and the side that reads it closes the connection.
A message is parsed once, here: its kind is a `Kind`, an event's "event" an `Event`.

What a connection may be sent is bounded by its `Limits` (the gateway's hello and broker session
take small messages with no frames; a run session takes big frames), checked from the declared
sizes before anything is allocated; a big frame's buffer starts at FIRST_BUFFER_BYTES and doubles
only as its bytes arrive, so a peer that declares a terabyte and sends nothing costs a MiB. `deadline` (time.monotonic()) bounds the
whole of what is read, however slowly the peer sends it. `admit`, when set, is asked before each
payload frame is read: a frame it refuses is read and dropped (an empty frame in its place), so
the connection stays in step and the reader can answer once the whole message has come
(the gateway's bytes of calls per account, intake.py).
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .kinds import Event, Kind, parse

MAX_HEADER_BYTES = 16 * 1024 * 1024  # a traceback, a chatty rank's output chunk, a status view
MAX_PAYLOAD_FRAMES = 64
MAX_PAYLOAD_BYTES = 1 << 40  # bounded in practice by the object store that takes the bytes
FIRST_BUFFER_BYTES = 1 << 20  # a frame's buffer before its bytes come; it doubles as they do
_LENGTH = struct.Struct(">Q")
_ZEROS = memoryview(bytes(1 << 20))  # a buffer grows by these (realloc moves pages, no temporary copy)


class FrameError(ValueError):
    """The other side sent something that is not a gateway message; the connection is closed."""


class Closed(EOFError):
    """The other side closed the connection (between messages or in the middle of one)."""


@dataclass(frozen=True)
class Message:
    """One message as read: its kind parsed (a `Kind`), its other JSON fields, its raw frames."""
    kind: Kind
    fields: dict[str, Any] = field(default_factory=dict)
    payload: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse(Kind, self.kind, field="kind", error=FrameError))

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass(frozen=True)
class Limits:
    """What one message read from a connection may be: its JSON header's bytes, its raw frames'
    count, each frame's bytes."""
    header: int = MAX_HEADER_BYTES
    payload_frames: int = MAX_PAYLOAD_FRAMES
    frame: int = MAX_PAYLOAD_BYTES


class Connection:
    """One socket, messages in both directions; sends are serialised, reads belong to one thread
    (which may change `limits` and `deadline` between messages)."""

    def __init__(self, sock: socket.socket, limits: Limits = Limits()) -> None:
        self.sock = sock
        self.limits = limits
        self.deadline: float | None = None  # time.monotonic() past which a read raises TimeoutError
        self.admit: Callable[[int], bool] | None = None  # asked with each payload frame's size; False: dropped
        self._send_lock = threading.Lock()

    def send(self, kind: Kind, payload: list[bytes | bytearray | memoryview] | tuple = (), **fields: Any) -> None:
        if "kind" in fields or "payload" in fields:
            raise ValueError("'kind' and 'payload' are the frame's own fields")
        kind = Kind(kind)
        header = json.dumps({"kind": kind, **fields, "payload": len(payload)}).encode()
        if len(header) > MAX_HEADER_BYTES:
            raise FrameError(f"a {kind} message of {len(header)} bytes is over the {MAX_HEADER_BYTES}-byte limit")
        with self._send_lock:
            self.sock.sendall(_LENGTH.pack(len(header)) + header)
            for chunk in payload:
                view = memoryview(chunk).cast("B")
                self.sock.sendall(_LENGTH.pack(view.nbytes))
                self.sock.sendall(view)

    def receive(self) -> Message:
        limits = self.limits
        header = self._frame(limits.header, what="header")
        try:
            fields = json.loads(header)
        except (UnicodeDecodeError, ValueError) as exc:
            raise FrameError(f"a frame that is not JSON ({exc})") from None
        if not isinstance(fields, dict) or not isinstance(fields.get("kind"), str):
            raise FrameError("a message without a kind")
        kind, count = parse(Kind, fields.pop("kind"), field="kind", error=FrameError), fields.pop("payload", 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= limits.payload_frames:
            raise FrameError(f"a {kind.value!r} message with a payload count of {count!r}")
        if kind is Kind.EVENT:
            fields["event"] = parse(Event, fields.get("event"), field="event", error=FrameError)
        return Message(kind, fields, [self._frame(limits.frame, what="payload") for _ in range(count)])

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _frame(self, limit: int, *, what: str) -> bytes:
        size = _LENGTH.unpack(self._exactly(_LENGTH.size, between_messages=what == "header"))[0]
        if size > limit:
            raise FrameError(f"a {what} frame of {size} bytes is over the {limit}-byte limit")
        if what == "payload" and self.admit is not None and not self.admit(size):
            self._drop(size)
            return b""
        return self._exactly(size, between_messages=False)

    def _drop(self, size: int) -> None:
        """Read `size` bytes and keep none of them (a MiB of memory, whatever the size)."""
        scratch = bytearray(min(size, 1 << 20))
        left = size
        while left:
            self._timeout_left()
            read = self.sock.recv_into(scratch, min(left, len(scratch)))
            if read == 0:
                raise Closed("the other side closed the connection in the middle of a message")
            left -= read

    def _timeout_left(self) -> None:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the other side did not send its message in time")
            self.sock.settimeout(left)

    def _exactly(self, size: int, *, between_messages: bool) -> bytes:
        buffer = bytearray(min(size, FIRST_BUFFER_BYTES))  # never more than what came, past the first
        got = 0
        while got < size:
            if got == len(buffer):  # full: double it (no view of it is held here)
                _grow(buffer, min(len(buffer), size - len(buffer)))
            self._timeout_left()
            with memoryview(buffer) as whole, whole[got:] as view:
                read = self.sock.recv_into(view, min(len(buffer) - got, 1 << 24))
            if read == 0:
                raise Closed("the other side closed the connection" + ("" if between_messages and got == 0
                                                                        else " in the middle of a message"))
            got += read
        return bytes(buffer) if size < (1 << 20) else buffer  # big payloads stay one buffer, no copy


def _grow(buffer: bytearray, more: int) -> None:
    """`more` zero bytes at the end of `buffer` (appended a MiB at a time: CPython reallocates
    geometrically, and a big block's realloc remaps its pages instead of copying them)."""
    for _ in range(more // len(_ZEROS)):
        buffer += _ZEROS
    buffer += _ZEROS[:more % len(_ZEROS)]
