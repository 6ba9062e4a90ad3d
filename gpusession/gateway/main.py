"""The gateway process, in one of two hostings:

`python -m gpusession.gateway.main [--detach-max-duration S] [--detach-retention S]
[--call-bytes-per-user SIZE] SOCKET DB_PATH [ADMIN ...]`: the hub's, run by its cluster
service as the service account once the broker is up (never root, never a user). It joins the
service's Ray cluster (RAY_ADDRESS and the token in its environment), reads the broker's identity
key and admin token beside the ledger DB_PATH, and serves the "broker" session (brokersession.py)
and the "run" session (hosted.py) to every local account, holding at most SIZE bytes of one
account's calls at a time (intake.py; a quarter of the machine's memory unless given). It exits when its stdin closes (so it
never outlives the service that started it) or on SIGTERM / SIGINT.

`python -m gpusession.gateway.main --user SOCKET`: a user's own (usergateway.py starts it, as that
user, for detached runs outside the hub). It joins the cluster at RAY_ADDRESS with the user's Ray
token, acts with the user's own identity (no key, no admin token), serves the "run" session to its
own uid alone (its detached runs' default limit and retention from keeping.MAX_DURATION_ENV and
RETENTION_ENV in its environment), and exits after usergateway.IDLE_ENV seconds with no detached run kept and no
connection, when the cluster's head is gone, or on SIGTERM / SIGINT. It holds its directory's
gateway.lock while it runs and writes gateway.json there once it serves.

Both write one line on stdout, {"ready": {"socket": ..., "pid": ..., "sessions": [...]}} or
{"failed": "..."}, and remove their socket when they exit.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

from .acting import ServiceKeys
from .brokersession import error_type, serve_broker
from .server import GatewayServer

log = logging.getLogger("gpusession.gateway")
CALL_TIMEOUT_S = 30.0
WATCH_S = 1.0  # how often a user's gateway checks its idleness and the cluster's head
RAY_MISSES = 3  # checks in a row the head must fail before a user's gateway counts Ray as gone


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
    from ..broker.storage import secrets
    from ..launcher.rootfs import read_secret

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


def hub_gateway(socket_path: str, db_path: str, admins: list[str], policy, call_bytes: int,
                stop: threading.Event) -> GatewayServer:
    from .detached import REGISTRY
    from .intake import CALL_BYTES

    REGISTRY.policy = policy  # the admin's default time limit and retention of detached runs
    CALL_BYTES.limit = call_bytes  # what one account's calls may hold of this process's memory
    keys = load_keys(db_path)
    broker_call("info", [])  # joins Ray and finds the broker before anyone is let in
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    return GatewayServer(socket_path, sessions_for(keys), admins=frozenset(admins)).start()


def user_gateway(socket_path: str, stop: threading.Event) -> GatewayServer:
    from ..cluster import raycluster
    from ..identity import current_identity
    from . import usergateway
    from .acting import OwnIdentity
    from .detached import Registry
    from .hosted import serve_run

    if not os.environ.get("RAY_ADDRESS"):
        raise RuntimeError("RAY_ADDRESS is unset: a user's gateway joins the cluster its kernel runs on, never one "
                           "of its own.")
    idle_s = usergateway.idle_limit(os.environ)
    folder = Path(socket_path).parent
    held = usergateway.hold_directory(folder)
    raycluster.ensure_connected()
    import ray

    from .keeping import detach_policy_from_env

    registry = Registry(detach_policy_from_env(os.environ))
    server = GatewayServer(socket_path, {"run": partial(serve_run, keys=OwnIdentity(current_identity()),
                                                        registry=registry)},
                           only_uid=os.geteuid()).start()
    head = ray.get_runtime_context().gcs_address
    usergateway.write_record(folder, {"pid": os.getpid(), "socket": socket_path, "address": os.environ["RAY_ADDRESS"],
                                      "started": time.time(), "log": str(folder / usergateway.LOG_NAME)})
    _kept.append(held)  # the lock is the open file's: held until this process exits
    threading.Thread(target=_watch_user, args=(server, registry, head, idle_s, stop), daemon=True,
                     name="gpusession-user-gateway-watch").start()
    return server


_kept: list = []


def _watch_user(server: GatewayServer, registry, head: str, idle_s: float, stop: threading.Event) -> None:
    from ..cluster.raycluster import _reachable
    from .usergateway import exit_reason

    busy_at, misses = time.monotonic(), 0
    while not stop.wait(WATCH_S):
        now, quiet = time.monotonic(), server.quiet_since()
        busy_at = now if quiet is None or registry.holds_any() else max(busy_at, quiet)
        misses = 0 if _reachable(head, timeout=1.0) else misses + 1
        reason = exit_reason(now=now, busy_at=busy_at, idle_s=idle_s, ray_misses=misses, max_misses=RAY_MISSES)
        if reason:
            log.info("The user's gateway at %s exits: %s", server.path, reason)
            stop.set()


def serve(start, *args) -> int:
    """Run the gateway `start(*args, stop)` makes until `stop` is set (a signal, or its own watch)."""
    global _out
    _out = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's line; Ray's chatter on fd 1 goes to stderr
    os.dup2(2, 1)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = None
    try:
        server = start(*args, stop)
        _say({"ready": {"socket": str(server.path), "pid": os.getpid(), "sessions": sorted(server.sessions)}})
        stop.wait()
        return 0
    except Exception as exc:
        log.exception("The gateway failed")
        _say({"failed": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        if server is not None:
            server.stop()
            if start is user_gateway:
                from .usergateway import RECORD_NAME

                (server.path.parent / RECORD_NAME).unlink(missing_ok=True)


_out = sys.stdout


def _say(message: dict) -> None:
    try:
        print(json.dumps(message), file=_out, flush=True)
    except OSError:  # whoever started it is gone (a user's gateway outlives its kernel)
        pass


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if len(argv) == 2 and argv[0] == "--user":
        return serve(user_gateway, argv[1])
    from .intake import OPTION, default_limit, size_of
    from .keeping import detach_policy

    try:
        given, rest = _leading_flags(argv)
        policy = detach_policy(given.get("--detach-max-duration"), given.get("--detach-retention"))
        call_bytes = size_of(given[OPTION]) if OPTION in given else default_limit()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if len(rest) < 2 or rest[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    return serve(hub_gateway, rest[0], rest[1], rest[2:], policy, call_bytes)


FLAGS = {"--detach-max-duration": "seconds, or e.g. 8h, 3d", "--detach-retention": "seconds, or e.g. 8h, 3d",
         "--call-bytes-per-user": "bytes, or e.g. 8G"}


def _leading_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """PURE: the leading FLAGS with their values, and the rest."""
    given, rest = {}, list(argv)
    while rest and rest[0] in FLAGS:
        if len(rest) < 2:
            raise ValueError(f"{rest[0]} needs a value ({FLAGS[rest[0]]})")
        given[rest[0]], rest = rest[1], rest[2:]
    return given, rest


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
