"""PURE: what the gateway's broker session offers, how a request is checked, and how the
service turns a checked request into the broker call it makes for the caller.

A request names a method and its arguments by name; it never carries credentials. The service
fills the broker's `auth` argument itself: the caller's name (from SO_PEERCRED) signed with the
identity key, and the admin token only for a caller the configuration names admin.

    client -> {"kind": "call", "id": 7, "method": "leases", "args": {"include_ended": true}}
    server -> {"kind": "result", "id": 7, "result": [...]}
              {"kind": "error", "id": 7, "type": "NotAuthorized", "message": "..."}

Anything not offered here (leasing, `signing_key`, `release`, `retire`) is refused before the
broker sees it; so is an argument of the wrong type, a missing or unknown one, or a request
over MAX_REQUEST_BYTES.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest

AUTH = "auth"  # the slot the service fills; a client never sends it
MAX_REQUEST_BYTES = 64 * 1024
MAX_NAME_CHARS = 256
MAX_BOUNDS = 64
INFO_FIELDS = ("version", "protocol", "ledger_id", "policy")  # never db_path, never the broker's pid


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _lease_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63


def _name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _time_or_none(value: Any) -> bool:
    return value is None or _number(value)


def _bounds(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_BOUNDS and all(_number(v) for v in value)


@dataclass(frozen=True)
class Param:
    name: str
    check: Callable[[Any], bool]
    expected: str  # what to send, for the error message
    default: Any = ...  # ... : required


def _p(name: str, check: Callable[[Any], bool], expected: str, default: Any = ...) -> Param:
    return Param(name, check, expected, default)


# The broker method's positional parameters, in order; AUTH where the service puts the caller.
SIGNATURES: dict[str, tuple[Param | str, ...]] = {
    "whoami": (),  # answered by the gateway itself: {"user", "admin"}
    "following": (),  # answered by the gateway itself: {"pids": the caller's processes following a live run}
    "info": (),
    "cluster": (),
    "status": (AUTH,),
    "leases": (AUTH, _p("include_ended", _bool, "true or false", False)),
    "revoke": (_p("lease_id", _lease_id, "a lease id (a whole number >= 0)"), AUTH),
    "quotas": (AUTH,),
    "quota": (_p("user", _name, "a user name (1-256 characters)"), AUTH),
    "set_quota": (_p("user", _name, "a user name (1-256 characters)"),
                  _p("update", _object, 'a JSON object, e.g. {"max_gpus": 2}'), AUTH),
    "reset_quota": (_p("user", _name, "a user name (1-256 characters)"), AUTH),
    "usage": (AUTH, _p("since", _time_or_none, "null or seconds since the epoch", None),
              _p("until", _time_or_none, "null or seconds since the epoch", None),
              _p("by", _name, '"user" or "day"', "user")),
    "stats": (AUTH, _p("wait_bounds", _bounds, f"a list of at most {MAX_BOUNDS} numbers")),
}
METHODS = frozenset(SIGNATURES)


@dataclass(frozen=True)
class Call:
    """A checked request: the method and its arguments by name (defaults filled in)."""

    method: str
    args: dict[str, Any]


def check(fields: Mapping[str, Any], payload_frames: int = 0) -> Call:
    """The request a `call` message asks for; InvalidRequest naming the field and what to send."""
    if payload_frames:
        raise InvalidRequest("A broker call carries no payload frames; send its arguments in 'args'.")
    size = len(json.dumps(dict(fields), default=str))
    if size > MAX_REQUEST_BYTES:
        raise InvalidRequest(f"This request is {size} bytes; a broker call is at most {MAX_REQUEST_BYTES}.")
    method = fields.get("method")
    if not isinstance(method, str) or method not in SIGNATURES:
        shown = str(method)[:40] if method is not None else "nothing"
        raise InvalidRequest(f"The gateway offers no broker method {shown!r}; it offers {', '.join(sorted(METHODS))}.")
    given = fields.get("args", {})
    if not isinstance(given, dict):
        raise InvalidRequest(f"'args' of {method} must be a JSON object of arguments by name.")
    params = [p for p in SIGNATURES[method] if isinstance(p, Param)]
    known = {p.name for p in params}
    unknown = sorted(str(k)[:40] for k in given if k not in known)
    if unknown:
        if AUTH in unknown or any(k in ("user", "signature", "token") for k in unknown):
            raise InvalidRequest(f"{method} takes no credentials: the gateway knows who you are from the socket.")
        raise InvalidRequest(f"{method} takes no argument {unknown[0]!r}; it takes "
                             f"{', '.join(sorted(known)) or 'none'}.")
    args: dict[str, Any] = {}
    for param in params:
        if param.name not in given:
            if param.default is ...:
                raise InvalidRequest(f"{method} needs '{param.name}': {param.expected}.")
            args[param.name] = param.default
            continue
        value = given[param.name]
        if not param.check(value):
            raise InvalidRequest(f"'{param.name}' of {method} must be {param.expected}; got {_shown(value)}.")
        args[param.name] = value
    return Call(method, args)


def broker_args(call: Call, auth: dict) -> list[Any]:
    """The positional arguments of the broker method, `auth` in its slot."""
    return [auth if p == AUTH else call.args[p.name] for p in SIGNATURES[call.method]]


def named(method: str, positional: tuple | list) -> dict[str, Any]:
    """The bridge's positional form (auth included, as jupyter_ext's handlers pass it) as the
    gateway's named arguments, the auth slot dropped: the gateway fills it."""
    if method not in SIGNATURES:
        raise InvalidRequest(f"The gateway offers no broker method {method!r}; it offers {', '.join(sorted(METHODS))}.")
    slots = SIGNATURES[method]
    if len(positional) > len(slots):
        raise InvalidRequest(f"{method} takes at most {len(slots)} arguments; got {len(positional)}.")
    return {slot.name: value for slot, value in zip(slots, positional) if isinstance(slot, Param)}


def auth_for(user: str, signature: str, admin_token: str | None) -> dict:
    """The broker's auth for a caller: the signed name; with the token for an admin."""
    auth = {"user": user, "signature": signature}
    if admin_token is not None:
        auth.update(token=admin_token, by=user)
    return auth


def scrub(method: str, result: Any) -> Any:
    """What a caller is shown of a broker answer: `info` without where the ledger lives."""
    if method == "info" and isinstance(result, dict):
        return {k: result[k] for k in INFO_FIELDS if k in result}
    return result


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
