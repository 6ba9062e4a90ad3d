"""`python -m jupyter_ext.bridge [POLICY_JSON]`: the Jupyter server's one connection to Ray.

The server never calls `ray.init` in its own process (it blocks, and Ray takes over signal
handlers), so it starts this process instead. The bridge joins the cluster named by RAY_ADDRESS,
gets the broker (creating it with POLICY_JSON, a BrokerConfig dict, when none runs yet), then
answers broker calls, one JSON object per line, several at a time:

    stdout, first line:  {"ready": {"version": ..., "db_path": ..., "address": ...}}  or  {"failed": "..."}
    stdin:               {"id": 7, "method": "leases", "args": [{"user": "alice", "signature": "..."}]}
                         (and "kwargs": {...} for keyword arguments, e.g. release's auth)
    stdout:              {"id": 7, "result": [...]}  or  {"id": 7, "error": {"type": "NotAuthorized", "message": "..."}}

It exits when its stdin closes, so it never outlives the server.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor

METHODS = frozenset({"info", "cluster", "status", "leases", "revoke", "quotas", "quota", "set_quota",
                     "reset_quota", "usage", "signing_key", "stats",
                     "release"})  # `gpusession hub` closes what is left open when it stops (needs the token)
CALL_TIMEOUT_S = 30.0


class Channel:
    """The protocol's stdout; anything else written to fd 1 (Ray's messages) goes to stderr."""

    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        self.lock = threading.Lock()

    def send(self, message: dict) -> None:
        line = json.dumps(message, default=str)
        with self.lock:
            self.out.write(line + "\n")


def error_type(exc: BaseException) -> str:
    """A named gpusession error keeps its name; Ray's "cannot reach the broker" is Unavailable;
    anything else (a bare TypeError or ValueError included) is a bug: BrokerFailed."""
    from gpusession.errors import ERRORS_BY_NAME, CallFailure

    if type(exc).__name__ in ERRORS_BY_NAME:
        return type(exc).__name__
    if _unreachable(exc):
        return CallFailure.UNAVAILABLE
    return CallFailure.BROKER_FAILED


def _unreachable(exc: BaseException) -> bool:
    from ray import exceptions

    return isinstance(exc, (exceptions.RayActorError, exceptions.GetTimeoutError, exceptions.RaySystemError,
                            ConnectionError, TimeoutError))


def answer(channel: Channel, request: dict) -> None:
    from gpusession.broker import client
    from gpusession.errors import CallFailure

    try:
        method = request.get("method")
        if method not in METHODS:
            raise LookupError(f"The bridge does not offer {method!r}; it offers {', '.join(sorted(METHODS))}.")
        handle = client.broker()
        result = client.call(getattr(handle, method), *request.get("args", []), timeout=CALL_TIMEOUT_S,
                             **request.get("kwargs", {}))
        channel.send({"id": request.get("id"), "result": result})
    except Exception as exc:  # every failure goes back to the caller as a typed error
        kind = error_type(exc)
        if kind == CallFailure.UNAVAILABLE:
            client.forget()  # the broker may have been restarted or replaced: look it up again
        message = str(exc) or repr(exc)
        if kind == CallFailure.BROKER_FAILED and type(exc).__name__ != "BrokerFailed":
            incident = uuid.uuid4().hex[:8]
            print(f"gpusession bridge: {request.get('method')} failed (incident {incident})", file=sys.stderr)
            traceback.print_exc()
            message = (f"The gpusession bridge failed on {request.get('method')} (incident {incident}); nothing "
                       "is known to have changed. The Jupyter server's log has the cause under that incident id.")
        channel.send({"id": request.get("id"), "error": {"type": kind, "message": message}})


def connect(policy: dict | None) -> dict:
    import ray

    from gpusession.broker import client
    from gpusession.broker.service.settings import BrokerConfig
    from gpusession.cluster.raycluster import _reachable

    address = os.environ.get("RAY_ADDRESS", "")
    if ":" in address and "://" not in address and not _reachable(address, timeout=5.0):
        raise ConnectionError(f"nothing answers at {address}; start that Ray cluster or fix c.GPUSession.ray_address")
    handle = client.broker(BrokerConfig(**policy) if policy else None)
    info = client.call(handle.info)
    info["address"] = ray.get_runtime_context().gcs_address
    info["ledger_here"] = client.ledger_path_here((policy or {}).get("db_path"))  # the server reads the token beside it
    return info


def main(argv: list[str]) -> int:
    channel = Channel()
    try:
        info = connect(json.loads(argv[0]) if argv else None)
    except Exception as exc:  # report why, then exit: the server shows it
        channel.send({"failed": f"{type(exc).__name__}: {exc}"})
        return 1
    channel.send({"ready": info})
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="bridge") as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(answer, channel, json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
