"""What a rank process sends its worker actor, as data that is never unpickled there.

The rank runs the user's code; the worker actor is the service's (issue 28: under `gpusession
hub` ranks will run as their users, the actor as the service account). A pickle from the rank
would run whatever code the rank chose inside the actor, so this direction carries no pickle:
each message is one frame of JSON naming its kind (one of RANK_MESSAGES, checked field by field
and type by type), and a message that carries the user's bytes (a checkpoint, a result) is
followed by one frame of those raw bytes, which the actor relays without looking inside.
Anything else (an unknown kind, a missing or extra field, a wrong type, bytes that are not JSON)
is WireError: the actor stops reading that rank and fails its call.

The other direction (the actor's Launch, acks and checkpoint requests to its rank) stays pickled:
a rank unpickling what the service sends it trusts only the service.
"""
from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any, Callable

from .comm_options import CommOptions, CommReport
from . import messages as m

MAX_HEADER_BYTES = 16 * 1024 * 1024  # an Output frame of a chatty rank, a traceback, a report


class WireError(ValueError):
    """A rank sent something that is not one of its messages; the actor stops reading it."""


def _text(value: Any) -> str:
    return _checked(value, str, "text")


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"expected a number, got {type(value).__name__}")
    return value


def _whole(value: Any) -> int:
    return _checked(value, int, "a whole number")


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


def _checked(value: Any, kind: type, name: str) -> Any:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise WireError(f"expected {name}, got {type(value).__name__}")
    return value


def _chunks(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not all(isinstance(c, list) and len(c) == 2 for c in value):
        raise WireError("output chunks must be [stream, text] pairs")
    return tuple((_checked(s, str, "a stream name"), _text(t)) for s, t in value)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise WireError("expected a list of names")
    return tuple(_text(v) for v in value)


def _sizes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 100_000:
        raise WireError("expected a list of buffer sizes")
    sizes = tuple(_whole(v) for v in value)
    if any(size < 0 for size in sizes):
        raise WireError("a buffer size is negative")
    return sizes


def _epochs(value: Any) -> tuple:
    if not isinstance(value, list):
        raise WireError("expected a list of loader epochs")
    return tuple(_optional(_whole)(v) for v in value)


def _metrics(value: Any) -> dict:
    if not isinstance(value, dict):
        raise WireError("a report's metrics must be an object")
    return value  # plain JSON values: numbers, text, lists and objects of them (plain_metric)


def _flag(value: Any) -> bool:
    return _checked(value, bool, "true or false")


# kind -> (message class, field -> how to check it, whether a frame of raw bytes follows)
RANK_MESSAGES: dict[str, tuple[type, dict[str, Callable[[Any], Any]], bool]] = {
    "Output": (m.Output, {"chunks": _chunks}, False),
    "Report": (m.Report, {"metrics": _metrics}, False),
    "Started": (m.Started, {"at": _number, "host": _text, "address": _text, "pid": _whole}, False),
    "Communication": (m.Communication, {"applied": _flag, "steps": _whole, "bytes_last_step": _whole,
                                        "fp32_bytes_per_step": _whole, "scaled_steps": _whole}, False),
    "CheckpointSaved": (m.CheckpointSaved, {"step": _whole}, False),
    "CheckpointData": (m.CheckpointData, {"loader_epochs": _epochs}, True),
    "WatchesCheckpoints": (m.WatchesCheckpoints, {}, False),
    "Result": (m.Result, {"has_value": _flag, "nbytes": _whole}, False),
    "Pickled": (m.Pickled, {"bulk_sizes": _sizes}, True),
    "RankError": (m.RankError, {"rank": _whole, "host": _text, "type": _text, "message": _text,
                                "traceback": _text, "at": _number, "mro": _strings}, False),
    "StoreServing": (m.StoreServing, {"port": _whole, "error": _text}, False),
}
_KINDS = {cls: kind for kind, (cls, _, _) in RANK_MESSAGES.items()}


def encode(message: Any) -> tuple[bytes, bytes | None]:
    """The frames of one message: its JSON header, and its raw bytes when it carries any."""
    kind = _KINDS.get(type(message))
    if kind is None:
        raise TypeError(f"{type(message).__name__} is not a message a rank sends")
    _, checks, carries_bytes = RANK_MESSAGES[kind]
    if isinstance(message, m.Communication):
        fields = {name: getattr(message.report, name) for name in checks}
    else:
        fields = {name: getattr(message, name) for name in checks}
    header = json.dumps({"kind": kind, **fields}, default=plain_metric).encode()
    return header, (bytes(message.data) if carries_bytes else None)


def decode(header: bytes, payload: Callable[[], bytes], *, comm: CommOptions | None = None) -> Any:
    """The message of a header frame; `payload()` reads the raw frame that follows it, if the kind
    has one. `comm` is what the caller asked gs.prepare_model to apply (a Communication message
    carries only what rank 0 counted). WireError for anything that is not a rank's message."""
    if len(header) > MAX_HEADER_BYTES:
        raise WireError(f"a message of {len(header)} bytes is over the {MAX_HEADER_BYTES}-byte limit")
    try:
        fields = json.loads(header)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"the rank sent bytes that are not a message ({exc})") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("kind"), str):
        raise WireError("the rank sent a message without a kind")
    kind = fields.pop("kind")
    if kind not in RANK_MESSAGES:
        raise WireError(f"the rank sent a message of unknown kind {kind[:80]!r}")
    cls, checks, carries_bytes = RANK_MESSAGES[kind]
    if set(fields) != set(checks):
        raise WireError(f"a {kind} message needs the fields {sorted(checks)}; it had {sorted(fields)[:20]}")
    try:
        values = {name: check(fields[name]) for name, check in checks.items()}
    except WireError as exc:
        raise WireError(f"a {kind} message: {exc}") from None
    if cls is m.Communication:
        return m.Communication(CommReport(options=comm or CommOptions(), **values))
    if carries_bytes:
        values["data"] = payload()
    return cls(**values)


def plain_metric(value: Any) -> Any:
    """A reported value JSON cannot hold, as one it can: numbers (numpy's too) as Python numbers,
    anything else as its repr (shown in the table; only numbers are plotted)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return repr(value)


def field_names(cls: type) -> set[str]:
    """The fields of a message class (for the test that RANK_MESSAGES checks every one)."""
    return {f.name for f in dataclasses.fields(cls)}
