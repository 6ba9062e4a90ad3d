"""`python -m gpusession.gateway.main SOCKET DB_PATH [ADMIN ...]`: the gateway process, run by
the hub's cluster service as the service account once the broker is up (never root, never a
user). It joins the service's Ray cluster (RAY_ADDRESS and the token in its environment), reads
the broker's identity key and admin token beside the ledger DB_PATH, and serves the gateway at
SOCKET: the "broker" session (brokersession.py) and the "run" session (hosted.py).

    stdout, one line:  {"ready": {"socket": ..., "pid": ..., "sessions": [...]}}  or  {"failed": "..."}
It removes its socket and exits when its stdin closes (so it never outlives the service that
started it) or on SIGTERM / SIGINT.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from functools import partial

from .acting import ServiceKeys
from .brokersession import error_type, serve_broker
from .server import GatewayServer

log = logging.getLogger("gpusession.gateway")
CALL_TIMEOUT_S = 30.0


def broker_call(method: str, args: list):
    """One broker call as this driver (the service account); a vanished broker is looked up again."""
    from ..broker import client

    try:
        return client.call(getattr(client.broker(), method), *args, timeout=CALL_TIMEOUT_S)
    except Exception as exc:
        if error_type(exc) == "Unavailable":
            client.forget()
        raise


def load_keys(db_path: str) -> ServiceKeys:
    """The broker's secrets beside its ledger: this account's own private regular files (the broker
    made them), read as the hub's root reads a secret (no symlink, no FIFO, not empty)."""
    from ..broker import secrets
    from ..hub.rootfs import read_secret

    token_path, key_path = secrets.admin_token_path(db_path), secrets.identity_key_path(db_path)
    for path in (token_path, key_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: start the broker (it makes it) before the gateway.")
    return ServiceKeys(identity_key=read_secret(key_path, owner=os.geteuid()).encode(),
                       admin_token=read_secret(token_path, owner=os.geteuid()))


def sessions_for(keys: ServiceKeys, call=broker_call) -> dict:
    from .hosted import serve_run  # the run path (Ray, the controller): the broker session needs none of it

    return {"broker": partial(serve_broker, keys=keys, broker_call=call),
            "run": partial(serve_run, keys=keys)}


def serve(socket_path: str, db_path: str, admins: list[str]) -> int:
    global _out
    _out = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's line; Ray's chatter on fd 1 goes to stderr
    os.dup2(2, 1)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    server = None
    try:
        keys = load_keys(db_path)
        broker_call("info", [])  # joins Ray and finds the broker before anyone is let in
        server = GatewayServer(socket_path, sessions_for(keys), admins=frozenset(admins)).start()
        _say({"ready": {"socket": socket_path, "pid": os.getpid(), "sessions": sorted(server.sessions)}})
        stop.wait()
        return 0
    except Exception as exc:
        log.exception("The gateway failed")
        _say({"failed": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        if server is not None:
            server.stop()


_out = sys.stdout


def _say(message: dict) -> None:
    print(json.dumps(message), file=_out, flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(serve(sys.argv[1], sys.argv[2], sys.argv[3:]))
