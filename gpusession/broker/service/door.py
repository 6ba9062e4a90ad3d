"""The broker's door: what a caller may see of a failure.

A refusal is one of gpusession's named errors (GPUSessionError subclasses: InvalidRequest,
NotAuthorized, LeaseNotFound, ...) and passes as it is. A call whose arguments do not fit the
method is refused as InvalidRequest before the method runs. Anything else raised inside a
method, a bare TypeError or ValueError included, is a bug: it is logged with an incident id and
reaches the caller as BrokerFailed, whose message has no file paths, SQL or secrets."""
from __future__ import annotations

import functools
import inspect
import logging
import uuid

from ...errors import BrokerFailed, GPUSessionError, InvalidRequest

log = logging.getLogger("gpusession.broker")


def door(method):
    """Named refusals pass as they are; anything else is logged and becomes BrokerFailed."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    async def checked(self, *args, **kwargs):
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise InvalidRequest(f"{method.__name__} was called with arguments it does not take ({exc}); "
                                 f"it takes ({_takes(signature)}). Nothing was changed.") from None
        try:
            return await method(self, *args, **kwargs)
        except GPUSessionError:
            raise
        except Exception:
            raise incident(method.__name__) from None

    return checked


def _takes(signature: inspect.Signature) -> str:
    """"lease_id, seen_version, timeout_s=1.0, *, auth": the parameters after self, as a caller writes them."""
    out, starred = [], False
    for param in list(signature.parameters.values())[1:]:
        if param.kind is param.KEYWORD_ONLY and not starred:
            out.append("*")
            starred = True
        out.append(param.name if param.default is param.empty else f"{param.name}={param.default!r}")
    return ", ".join(out)


def incident(name: str) -> BrokerFailed:
    """Log the exception being handled under a new incident id; the BrokerFailed to raise instead."""
    number = uuid.uuid4().hex[:8]
    log.exception("Broker call %s failed (incident %s)", name, number)
    return BrokerFailed(f"The broker failed on {name} (incident {number}); nothing is known to have changed. "
                        "Try again; an admin finds the cause in the broker's log on the head node by that "
                        "incident id.")
