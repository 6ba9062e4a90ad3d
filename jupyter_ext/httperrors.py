"""The one place where domain errors become HTTP statuses (the errors themselves know no tornado).

    with http_errors():
        ...  # a NotAuthorized raised here reaches the client as 403 {"message": "..."}

Every refusal is a named error (InvalidRequest for a bad value, NotAuthorized, ...). Anything
else raised inside, a bare TypeError or ValueError included, is a bug: it is logged with an
incident id and answered 500 {"message": "... (incident 1a2b3c4d) ...", "incident": "1a2b3c4d"}.
"""
from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager

from tornado import web

from gpusession.errors import (BrokerFailed, BrokerOutdated, Infeasible, InvalidRequest, LeaseNotFound,
                               NotAuthorized, QuotaExceeded)

from .brokerlink import BrokerUnavailable

log = logging.getLogger("gpusession.server")

STATUS = (
    (NotAuthorized, 403),  # not an admin, not the owner, or an unsigned identity
    (LeaseNotFound, 404),
    (Infeasible, 409),
    (QuotaExceeded, 409),
    (InvalidRequest, 400),  # bad input; the message names the field
    (BrokerUnavailable, 503),  # cluster starting, stopped or unreachable: try again
    (BrokerOutdated, 503),
    (BrokerFailed, 500),  # a bug in the broker or the bridge; its log has the incident id
)


class APIError(web.HTTPError):
    """An HTTP error whose message goes to the client as is (a user name may contain '%')."""

    def __init__(self, status: int, message: str, details: dict | None = None) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.details = details or {}  # more JSON fields, e.g. {"state": "starting", "elapsed_s": 12}


def status_for(error: BaseException) -> int | None:
    """The status of a named refusal or failure; None for anything else (a bug)."""
    for kind, status in STATUS:
        if isinstance(error, kind):
            return status
    return None


@contextmanager
def http_errors():
    """A mapped domain error becomes APIError(status, its message); anything else is logged with
    an incident id and becomes APIError(500) naming that id (never the exception's text)."""
    try:
        yield
    except web.HTTPError:
        raise
    except Exception as exc:
        status = status_for(exc)
        if status is not None:
            raise APIError(status, str(exc), getattr(exc, "details", None)) from exc
        incident = uuid.uuid4().hex[:8]
        log.exception("gpusession request failed (incident %s)", incident)
        raise APIError(500, f"gpusession failed on this request (incident {incident}); nothing is known to have "
                            "changed. Try again; an admin finds the cause in the Jupyter server's log by that "
                            "incident id.", {"incident": incident}) from exc
