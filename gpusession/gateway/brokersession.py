"""The gateway's "broker" session: answer a caller's broker calls (status, leases, quotas, the
admin page's calls) as that caller, whoever the request says it is.

Each `call` message is checked (brokercalls.check), the broker's `auth` is made here from the
connection's caller (signed with the identity key; the admin token only for a configured admin)
and the answer goes back with the request's id. Calls of one connection run side by side (a
Jupyter server's page polls while the admin revokes); a message that is not a gateway frame
ends the connection, a request the session cannot take gets an error reply and changes nothing.
"""
from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import ERRORS_BY_NAME, CallFailure
from . import brokercalls
from .acting import Acting, admin_token_for, identity_of
from .activity import FOLLOWING
from .frames import Connection, Message
from .server import Caller
from .kinds import Kind

log = logging.getLogger("gpusession.gateway.broker")
CALLS_AT_ONCE = 8  # per connection
CALLS_QUEUED = 64  # per connection: past this, the session reads no more until answers go out
BrokerCall = Callable[[str, list], Any]  # (method, positional args) -> the broker's answer


def error_type(exc: BaseException) -> str:
    """PURE: the typed error a caller gets: a gpusession error keeps its name; Ray's "cannot
    reach the broker" is Unavailable; anything else is BrokerFailed."""
    name = type(exc).__name__
    if name in ERRORS_BY_NAME:
        return name
    if name in ("RayActorError", "GetTimeoutError", "RaySystemError", "ActorDiedError",
                "ActorUnavailableError") or isinstance(exc, (ConnectionError, TimeoutError)):
        return CallFailure.UNAVAILABLE
    return CallFailure.BROKER_FAILED


def answer(caller: Caller, keys: Acting, message: Message, broker_call: BrokerCall) -> dict:
    """The reply (fields of a result or error message) to one call message of `caller`."""
    reply_id = message.get("id") if isinstance(message.get("id"), (int, str)) else None
    try:
        call = brokercalls.check(message.fields, len(message.payload))
        if call.method == "whoami":
            return {"kind": Kind.RESULT, "id": reply_id, "result": {"user": caller.user, "admin": caller.admin}}
        if call.method == "following":  # the caller's own account only: its server's kernels among them
            return {"kind": Kind.RESULT, "id": reply_id, "result": {"pids": FOLLOWING.pids(caller.peer.uid)}}
        auth = brokercalls.auth_for(caller.user, identity_of(caller, keys).signature, admin_token_for(caller, keys))
        result = broker_call(call.method, brokercalls.broker_args(call, auth))
        plain = json.loads(json.dumps(brokercalls.scrub(call.method, result), default=str))
        return {"kind": Kind.RESULT, "id": reply_id, "result": plain}
    except Exception as exc:  # every failure goes back as a typed error
        kind, text = error_type(exc), str(exc) or type(exc).__name__
        if kind == CallFailure.BROKER_FAILED and type(exc).__name__ != "BrokerFailed":
            incident = uuid.uuid4().hex[:8]
            log.exception("broker call %r of %s failed (incident %s)", message.get("method"), caller.user, incident)
            text = (f"The gpusession gateway failed on {str(message.get('method'))[:40]} (incident {incident}); "
                    "nothing is known to have changed. The service's log has the cause under that incident id.")
        return {"kind": Kind.ERROR, "id": reply_id, "type": kind, "message": text}


def serve_broker(conn: Connection, caller: Caller, hello: Message, keys: Acting,
                 broker_call: BrokerCall) -> None:
    """Answer `call` messages until the caller closes the connection."""
    log.info("broker session of %s (uid %d, pid %d%s)", caller.user, caller.peer.uid, caller.peer.pid,
             ", admin" if caller.admin else "")
    queued = threading.BoundedSemaphore(CALLS_QUEUED)
    with ThreadPoolExecutor(max_workers=CALLS_AT_ONCE, thread_name_prefix="gateway-broker") as pool:
        while True:
            message = conn.receive()  # Closed / FrameError end the session (the server logs it)
            if message.kind != Kind.CALL:
                conn.send(Kind.ERROR, id=None, type="InvalidRequest",
                          message=f"The broker session takes 'call' messages; got {message.kind[:40]!r}.")
                continue
            queued.acquire()  # a caller that floods calls waits for its own answers
            pool.submit(_reply, conn, caller, keys, message, broker_call, queued)


def _reply(conn: Connection, caller: Caller, keys: Acting, message: Message, broker_call: BrokerCall,
           queued: threading.BoundedSemaphore) -> None:
    try:
        _send(conn, answer(caller, keys, message, broker_call))
    finally:
        queued.release()


def _send(conn: Connection, fields: dict) -> None:
    try:
        conn.send(fields.pop("kind"), **fields)
    except OSError:  # the caller went away meanwhile
        pass
    except (TypeError, ValueError) as exc:  # an answer over the frame limit: say so instead
        try:
            conn.send(Kind.ERROR, id=fields.get("id"), type="BrokerFailed",
                      message=f"The answer could not be sent: {str(exc)[:300]}")
        except OSError:
            pass
