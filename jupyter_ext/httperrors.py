"""The one place where domain errors become HTTP statuses (the errors themselves know no tornado).

    with http_errors():
        ...  # a NotAuthorized raised here reaches the client as 403 {"message": "..."}
"""
from __future__ import annotations

from contextlib import contextmanager

from tornado import web

from gpusession.errors import BrokerFailed, BrokerOutdated, Infeasible, LeaseNotFound, NotAuthorized, QuotaExceeded

from .brokerlink import BrokerUnavailable

STATUS = (
    (NotAuthorized, 403),  # not an admin, not the owner, or an unsigned identity
    (LeaseNotFound, 404),
    (Infeasible, 409),
    (QuotaExceeded, 409),
    (BrokerUnavailable, 503),
    (BrokerFailed, 503),  # the broker failed on this call; its log has the incident id
    (BrokerOutdated, 503),  # cluster starting, stopped or unreachable: try again
    (ValueError, 400),  # bad input; the message names the field
    (TypeError, 400),
)


class APIError(web.HTTPError):
    """An HTTP error whose message goes to the client as is (a user name may contain '%')."""

    def __init__(self, status: int, message: str, details: dict | None = None) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.details = details or {}  # more JSON fields, e.g. {"state": "starting", "elapsed_s": 12}


def status_for(error: BaseException) -> int | None:
    for kind, status in STATUS:
        if isinstance(error, kind):
            return status
    return None


@contextmanager
def http_errors():
    """Turn a mapped domain error into APIError(status, its message); others pass through."""
    try:
        yield
    except web.HTTPError:
        raise
    except Exception as exc:
        status = status_for(exc)
        if status is None:
            raise
        raise APIError(status, str(exc), getattr(exc, "details", None)) from exc
