"""The caller's side of the gateway: where it is (GATEWAY_ENV), connect, say hello."""
from __future__ import annotations

import os
import socket

from ..cluster.where import GATEWAY_ENV
from ..errors import GPUSessionError
from .frames import Connection
from .server import VERSION
from .kinds import Kind


class GatewayRefused(GPUSessionError):
    """The gateway would not serve this connection (it says why)."""


def gateway_path() -> str | None:
    """The gateway's socket when this process reaches gpusession through one, else None."""
    return os.environ.get(GATEWAY_ENV) or None


def connect(session: str, path: str | None = None, *, timeout_s: float = 10.0) -> tuple[Connection, dict]:
    """A connection to the gateway for `session` ("broker" or "run"), and its welcome
    ({"user", "admin"}). GatewayRefused when it says no; GPUSessionError when nothing answers."""
    path = path or gateway_path()
    if not path:
        raise GPUSessionError(f"No gateway is configured ({GATEWAY_ENV} is unset).")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise GPUSessionError(f"The gpusession gateway at {path} does not answer ({exc.strerror or exc}); "
                              "is the hub's service running? An admin can look at its log.") from None
    conn = Connection(sock)
    try:
        try:
            conn.send(Kind.HELLO, version=VERSION, session=session)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused as it was accepted (too many connections of this account): the why waits to be read
        answer = conn.receive()
    except Exception:
        conn.close()
        raise
    if answer.kind != Kind.WELCOME:
        conn.close()
        raise GatewayRefused(f"The gpusession gateway refused this {session} connection: "
                             f"{answer.get('message', answer.kind)}")
    sock.settimeout(None)
    return conn, answer.fields
