"""The caller's side of the gateway's broker session (brokercalls.py has the protocol): no Ray,
no credentials; the gateway knows who calls from the socket.

    BrokerConnection   one connection, calls as concurrent futures matched by id (a Jupyter
                       server's link: its handlers await them, the event loop never blocks)
    call(...)          one call, waited for (a kernel's gs.status(), `%gpu status`, the CLI)
"""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

from ..errors import ERRORS_BY_NAME, GPUSessionError
from .client import connect
from .frames import Closed, FrameError
from .kinds import Kind

CALL_TIMEOUT_S = 35.0


class GatewayUnavailable(GPUSessionError):
    """The gateway cannot be reached now, or closed the connection."""


def error_of(fields: dict) -> BaseException:
    """PURE: the exception an error reply stands for (the bridge's typed errors)."""
    kind, message = fields.get("type"), str(fields.get("message", ""))
    if kind in ERRORS_BY_NAME:
        return ERRORS_BY_NAME[kind](message)
    return GatewayUnavailable(f"The gpusession gateway did not answer: {message}")


def _settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    try:
        future.set_exception(error) if error is not None else future.set_result(result)
    except InvalidStateError:  # the caller gave up before the reply came
        pass


class BrokerConnection:
    """One broker session; calls from any thread, answers by id."""

    def __init__(self, path: str | None = None, *, timeout_s: float = 10.0) -> None:
        self.conn, self.welcome = connect("broker", path, timeout_s=timeout_s)
        self.pending: dict[int, Future] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._read, name="gpusession-gateway-reader", daemon=True).start()

    @property
    def alive(self) -> bool:
        return not self.closed

    def call(self, method: str, **args: Any) -> Future:
        future: Future = Future()
        with self.lock:
            if self.closed:
                _settle(future, error=GatewayUnavailable("The connection to the gpusession gateway is closed."))
                return future
            request_id = next(self.ids)
            self.pending[request_id] = future
        try:
            self.conn.send(Kind.CALL, id=request_id, method=method, args=args)
        except (OSError, FrameError, TypeError, ValueError) as exc:
            with self.lock:
                self.pending.pop(request_id, None)
            _settle(future, error=GatewayUnavailable(f"Could not send {method} to the gpusession gateway: {exc}"))
        return future

    def close(self) -> None:
        self.closed = True
        self.conn.close()

    def _read(self) -> None:
        reason = "the gateway closed the connection"
        try:
            while True:
                message = self.conn.receive()
                with self.lock:
                    future = self.pending.pop(message.get("id"), None)
                if future is None:
                    continue
                if message.kind == Kind.RESULT:
                    _settle(future, result=message.get("result"))
                else:
                    _settle(future, error=error_of(message.fields))
        except (Closed, FrameError, OSError) as exc:
            reason = str(exc) or reason
        gone = GatewayUnavailable(f"The gpusession gateway connection ended ({reason}); try again. If it goes on, "
                                  "an admin can look at the hub's service log.")
        with self.lock:
            self.closed = True
            waiting, self.pending = list(self.pending.values()), {}
        for future in waiting:
            _settle(future, error=gone)


def call(method: str, *, path: str | None = None, timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> Any:
    """One broker call through the gateway, waited for; the broker's typed errors raised as themselves."""
    link = BrokerConnection(path)
    try:
        return link.call(method, **args).result(timeout=timeout_s)
    finally:
        link.close()
