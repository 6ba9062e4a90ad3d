"""The broker's read-only status endpoint: `GET /status?user=U&signature=S` on 127.0.0.1, with
"Authorization: token T" (T from the announcement, gpusession/broker/http/status_endpoint.py).

It answers exactly what the broker's `status` method answers for that caller (the same call,
the same identity check), so `gpusession status` on the head shows what the sidebar and the Ray
path show, in a fraction of the time. Nothing else is served: it changes nothing, and any other
path, method or a missing token gets an error and no data. It runs on the broker's event loop
and holds no connection longer than READ_TIMEOUT_S.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from secrets import token_hex
from typing import Awaitable, Callable

from ...errors import GPUSessionError, NotAuthorized
from .status_endpoint import Endpoint, announcement_path, remove, write

log = logging.getLogger("gpusession.broker")
LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 16_384
READ_TIMEOUT_S = 2.0


class BadRequest(ValueError):
    """The request is not one this endpoint serves (a wrong path, method or form)."""


@dataclass(frozen=True)
class StatusQuery:
    token: str | None
    auth: dict  # {"user", "signature"}: what the Ray path sends for `gpusession status`


def parse_head(head: bytes) -> StatusQuery:
    """PURE: the query an HTTP request head asks; BadRequest if it is not `GET /status`."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ")
    except ValueError:
        raise BadRequest("Not an HTTP request line.") from None
    url = urllib.parse.urlsplit(target)
    if method != "GET" or url.path != "/status":
        raise BadRequest(f"Only GET /status is served here, not {method} {url.path}.")
    headers = dict(_header(line) for line in lines[1:] if line)
    scheme, _, token = headers.get("authorization", "").partition(" ")
    query = urllib.parse.parse_qs(url.query)
    return StatusQuery(token if scheme.lower() == "token" else None,
                       {"user": _one(query, "user"), "signature": _one(query, "signature")})


def _header(line: str) -> tuple[str, str]:
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()


def _one(query: dict, name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def status_of(error: BaseException) -> HTTPStatus:
    """The HTTP status of a refused status call (the CLI turns it back into the same error)."""
    if isinstance(error, NotAuthorized):
        return HTTPStatus.FORBIDDEN
    if isinstance(error, ValueError):  # InvalidRequest and BadRequest are ValueErrors
        return HTTPStatus.BAD_REQUEST
    return HTTPStatus.INTERNAL_SERVER_ERROR


def response(status: HTTPStatus, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + data


async def open_or_none(answer: Callable[[dict], Awaitable[dict]], *, db_path: str,
                       ray_address: str) -> "StatusEndpoint | None":
    """The endpoint, listening and announced; None (and a warning) when it cannot be: the broker
    still answers through Ray, and `gpusession status` takes that path."""
    endpoint = StatusEndpoint(answer)
    try:
        await endpoint.open(db_path=db_path, ray_address=ray_address)
    except OSError as exc:
        log.warning("No status endpoint for `gpusession status` (%s); it joins Ray instead.", exc)
        endpoint.close()
        return None
    return endpoint


class StatusEndpoint:
    """Serves `answer(auth)` (the broker's `status`) to holders of its token."""

    def __init__(self, answer: Callable[[dict], Awaitable[dict]]) -> None:
        self.answer = answer
        self.token = token_hex(24)
        self.server: asyncio.base_events.Server | None = None
        self.announced: tuple[Path, Endpoint] | None = None

    async def open(self, *, db_path: str, ray_address: str) -> Endpoint:
        """Listen on loopback and announce it beside the ledger (replacing a predecessor's)."""
        self.server = await asyncio.start_server(self._serve, LOOPBACK, 0, limit=MAX_HEAD_BYTES)
        port = self.server.sockets[0].getsockname()[1]
        endpoint = Endpoint(f"http://{LOOPBACK}:{port}/status", self.token, ray_address, socket.gethostname(),
                            os.getpid())
        path = announcement_path(db_path)
        await asyncio.to_thread(write, path, endpoint)
        self.announced = (path, endpoint)
        log.info("Status endpoint for `gpusession status` at %s (announced in %s)", endpoint.url, path)
        return endpoint

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.announced is not None:
            remove(*self.announced)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            writer.write(await self._reply(head))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that sends no complete request in time gets nothing
        finally:
            writer.close()

    async def _reply(self, head: bytes) -> bytes:
        try:
            query = parse_head(head)
        except BadRequest as exc:
            return response(HTTPStatus.NOT_FOUND, {"message": str(exc)})
        if not (query.token and hmac.compare_digest(query.token, self.token)):
            return response(HTTPStatus.UNAUTHORIZED, {"message": "This endpoint needs the token of its "
                                                      "announcement (status-endpoint.json beside the ledger)."})
        try:
            return response(HTTPStatus.OK, await self.answer(query.auth))
        except (GPUSessionError, ValueError, TypeError) as exc:
            return response(status_of(exc), {"message": str(exc)})
