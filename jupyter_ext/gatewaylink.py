"""The server's broker link when it runs behind a gateway (GPUSESSION_GATEWAY is set: a
`gpusession hub` user server): the same futures API as BrokerLink, answered by the gateway's
broker session as this server's user. No bridge process, no Ray head, no Ray import, no token:
the handlers' auth argument is dropped here (brokercalls.named), the gateway acts for the
account the socket names."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from gpusession.errors import InvalidRequest
from gpusession.gateway import brokercalls
from gpusession.gateway.brokerclient import BrokerConnection, GatewayUnavailable

from .brokerlink import BrokerUnavailable, settle

CONNECT_TIMEOUT_S = 10.0


class GatewayLink:
    def __init__(self, path: str, *, log) -> None:
        self.path, self.log = path, log
        self.connection: BrokerConnection | None = None
        self.welcome: dict = {}

    def start(self, *, timeout_s: float = 35.0) -> dict:
        """Connect to the gateway; the broker's info (as the gateway shows it) and where."""
        try:
            self.connection = BrokerConnection(self.path, timeout_s=CONNECT_TIMEOUT_S)
            info = self.connection.call("info").result(timeout=timeout_s)
        except GatewayUnavailable as exc:
            raise BrokerUnavailable(str(exc)) from None
        except Exception as exc:
            raise BrokerUnavailable(f"Could not reach the gpusession gateway at {self.path}: {exc}") from None
        self.welcome = self.connection.welcome
        return {**info, "address": f"gateway {self.path}", "ledger_id": info.get("ledger_id", "?")}

    @property
    def alive(self) -> bool:
        return self.connection is not None and self.connection.alive

    def call(self, method: str, *args: Any) -> Future:
        """As BrokerLink.call: the bridge's positional arguments (auth included, and dropped)."""
        future: Future = Future()
        try:
            named = brokercalls.named(method, args)
        except InvalidRequest as exc:
            settle(future, error=exc)
            return future
        if not self.alive:
            settle(future, error=BrokerUnavailable("The connection to the gpusession gateway is closed; "
                                                   "the next request opens a new one."))
            return future
        inner = self.connection.call(method, **named)
        inner.add_done_callback(lambda done: settle(future, result=None if done.exception() else done.result(),
                                                    error=_translated(done.exception())))
        return future

    def stop(self, *, timeout_s: float = 5.0) -> None:
        if self.connection is not None:
            self.connection.close()


def _translated(error: BaseException | None) -> BaseException | None:
    if isinstance(error, GatewayUnavailable):
        return BrokerUnavailable(str(error))
    return error
