"""The broker's door: what a caller may see of a failure.

Errors a caller can act on (gpusession's own, a bad value, a wrong call) pass as they are; any
other failure is logged with an incident id and reaches the caller as BrokerFailed, whose
message has no file paths, SQL or secrets."""
from __future__ import annotations

import functools
import logging
import uuid

from ..errors import BrokerFailed, GPUSessionError

log = logging.getLogger("gpusession.broker")


def door(method):
    """Errors a caller may see pass as they are; anything else is logged and becomes BrokerFailed."""

    @functools.wraps(method)
    async def checked(self, *args, **kwargs):
        try:
            return await method(self, *args, **kwargs)
        except (GPUSessionError, ValueError, TypeError):
            raise
        except Exception:
            incident = uuid.uuid4().hex[:8]
            log.exception("Broker call %s failed (incident %s)", method.__name__, incident)
            raise BrokerFailed(f"The broker failed on {method.__name__} (incident {incident}); nothing is "
                               "known to have changed. Try again; an admin finds the cause in the broker's "
                               "log on the head node by that incident id.") from None

    return checked
