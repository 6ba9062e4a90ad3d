"""How the fuzz tests judge an outcome: a refusal is one of gpusession's named errors; anything
else (the broker's own BrokerFailed, a bare TypeError or ValueError, a 500) is a crash.

Pure, so tests/unit/test_fuzzcheck.py shows the judge tells the two apart."""
from __future__ import annotations

from gpusession.errors import BrokerFailed, GPUSessionError


class Crash(AssertionError):
    """A fuzzed call made the broker or the server fail instead of refusing the input."""


def judge_broker_error(name: str, args, exc: BaseException) -> str:
    """'refused' for a named refusal; raises Crash for anything else."""
    if isinstance(exc, BrokerFailed) or not isinstance(exc, GPUSessionError):
        raise Crash(f"{name}{_short(args)} crashed instead of refusing: {type(exc).__name__}: {exc}") from exc
    if not str(exc):
        raise Crash(f"{name}{_short(args)} was refused with an empty {type(exc).__name__} message")
    return "refused"


def judge_http(status: int, body: dict | None, where: str) -> str:
    """'answered' for 2xx, 'refused' for a 4xx with a message (405 may have none); Crash for any
    5xx (the fuzz runs against a server whose cluster is up)."""
    if status < 400:
        return "answered"
    if status >= 500:
        raise Crash(f"{where} answered {status}: {body}")
    if status != 405 and not (body or {}).get("message"):
        raise Crash(f"{where} answered {status} without a message: {body}")
    return "refused"


def _short(args) -> str:
    text = repr(args)
    return text if len(text) <= 200 else text[:197] + "..."
