"""Reading requests: each bad value raises InvalidRequest naming the field (the client gets a 400).

The values the broker checks again (lease ids, usage ranges and groupings) go through the same
checks as at the broker's door (gpusession.broker.protocol.request), so both refuse the same things."""
from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from gpusession.broker.protocol import request as checks
from gpusession.errors import InvalidRequest

USAGE_GROUPINGS = checks.USAGE_GROUPINGS


def json_object(body: bytes) -> dict:
    """The request body as a JSON object."""
    try:
        value = json.loads(body or b"")
    except ValueError as exc:
        raise InvalidRequest(f"The request body is not valid JSON ({exc}); send an object such as "
                         '{"max_gpus": 2}.') from None
    if not isinstance(value, dict):
        raise InvalidRequest(f'The request body must be a JSON object such as {{"max_gpus": 2}}; got {value!r}.')
    return value


def flag(name: str, text: str | None) -> bool:
    """A yes/no query parameter: true/1/yes or false/0/no; absent is no."""
    if text is None or text.strip().lower() in ("", "false", "0", "no"):
        return False
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    raise InvalidRequest(f"{name} must be true or false; got {text!r}.")


def lease_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidRequest(f"lease id must be a whole number such as 17; got {text[:40]!r}.")
    return checks.lease_id(int(text))


def moment(name: str, text: str | None) -> float | None:
    """A point in time: Unix seconds (1717200000) or an ISO date/time (2024-06-01, 2024-06-01T12:00Z).
    A date or time without a zone is UTC. Empty or absent: None."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value < 0:
            raise InvalidRequest(f"{name} must be a time >= 0; got {text!r}.")
        return checks.number(value, name, low=0.0, high=1e13, allowed="Unix seconds >= 0")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{name} must be Unix seconds or an ISO date such as 2024-06-01 or "
                         f"2024-06-01T12:00:00Z; got {text!r}.") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return checks.number(when.timestamp(), name, low=0.0, high=1e13, allowed="a time after 1970-01-01")


def usage_query(get: Any) -> tuple[float | None, float | None, str]:
    """since, until and by from a request's query (`get` is handler.get_query_argument)."""
    since, until = moment("since", get("since", None)), moment("until", get("until", None))
    by = checks.grouping(get("by", None) or "user")
    if since is not None and until is not None and since > until:
        raise InvalidRequest(f"since ({since:.0f}) is after until ({until:.0f}); swap them.")
    return since, until, by
