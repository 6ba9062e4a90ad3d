"""`python -m gpusession.hub.service GPUS POLICY_JSON GATEWAY_JSON [RAY_IP]`: the hub's cluster service,
one process run as the service account (never root, never a user): a local Ray head (its worker
actors ask root's launcher, GPUSESSION_LAUNCHER, for each rank, which runs as its user), the
broker (created here with the hub's policy before any user can reach it), then the gateway
(gpusession.gateway.main), the one door users have: GATEWAY_JSON = {"socket": ..., "admins": [...]}.
RAY_IP: the address the head advertises, where other nodes join (`gpusession hub node`).

    stdout, one line once all are up:  {"ready": {"address": ..., "gpus": 4, "logical": true, "db_path": ...,
                                                  "gateway": "/var/lib/gpusession-hub/gateway/gateway.sock"}}
                                  or:  {"failed": "..."}
It stops the gateway (by pid), the broker's bridge and the head when its stdin closes or it gets
SIGTERM / SIGINT.
SIGUSR1 closes every open lease at once (the hub is stopping: users' GPUs are freed while
JupyterHub still stops their servers) and keeps the head up until then.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

from jupyter_ext.brokerlink import BrokerLink

from ..broker.storage import secrets
from ..broker.policy.states import LeaseState
from ..cluster import localhead
from ..gateway import process as gatewayproc

log = logging.getLogger("gpusession.hub.service")
PRIVATE_FILES = Path(__file__).parent / "private_files"  # its sitecustomize: workers use umask 077


def serve(gpus: int, policy: dict, gateway_settings: dict, node_ip: str | None = None) -> int:
    stop, close_now = threading.Event(), threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: close_now.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    head = link = gateway = None
    try:
        os.environ["PYTHONPATH"] = str(PRIVATE_FILES)  # Ray's workers create files for this account only
        make_private_tmp(Path(os.environ["GPUSESSION_HOME"]))
        head = _start_head(gpus, node_ip)
        link = BrokerLink(env={**os.environ, **head.client_env()}, policy=policy, log=log)
        info = link.start()
        gateway = gatewayproc.start(env={**os.environ, **head.client_env()}, db_path=policy["db_path"],
                                    **gateway_settings)
        _say({"ready": {"address": head.address, "gpus": head.gpus, "logical": head.logical,
                        "db_path": info.get("db_path") or policy.get("db_path"), "pid": head.pid,
                        "gateway": gateway_settings["socket"]}})
        _wait_for_stop(stop, close_now, link, policy["db_path"])
        return 0
    except Exception as exc:  # one line for the hub; the service's log has the traceback
        log.exception("The hub's cluster service failed")
        _say({"failed": f"{type(exc).__name__}: {exc}" + (localhead.explain(head) if head is not None else "")})
        return 1
    finally:
        if gateway is not None:  # users lose their door first: no new calls while leases close
            gatewayproc.stop(gateway)
        if link is not None:
            _close_leases(link, policy["db_path"])
            link.stop()
        if head is not None:
            localhead.stop(pid=head.pid)


def make_private_tmp(home: Path) -> Path:
    """The account's own temporary directory (ranks' scratch, checkpoints), 0700, made here by the
    account itself: root never acts inside a directory this account can change (issue 28)."""
    private = home / "tmp"
    try:
        private.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(private)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeError(f"{private} is not a directory of this account ({os.geteuid()}); remove it and start again.")
    os.chmod(private, 0o700)
    return private


def _wait_for_stop(stop: threading.Event, close_now: threading.Event, link: BrokerLink, db_path: str) -> None:
    """Until stdin closes or SIGTERM: on SIGUSR1 close the leases and go on waiting."""
    while not stop.wait(0.1):
        if close_now.is_set():
            close_now.clear()
            _close_leases(link, db_path)


def _start_head(gpus: int, node_ip: str | None, attempts: int = 3) -> localhead.LocalHead:
    """The head; `ray start` gives its raylet a fixed 30 s to register, which a loaded machine
    sometimes misses: try again (each failure is logged with the head's log tail)."""
    for attempt in range(1, attempts + 1):
        try:
            return localhead.start(gpus=gpus, node_ip=node_ip)[0]
        except localhead.LocalHeadError as exc:
            if attempt == attempts:
                raise
            log.warning("The Ray head did not start (attempt %d of %d), trying again: %s", attempt, attempts, exc)
    raise AssertionError("unreachable")


def _close_leases(link: BrokerLink, db_path: str) -> None:
    """Close every lease still open (the users' servers, and so their kernels, are gone by now):
    the ledger ends them by the broker's clock and Ray frees their GPUs before the head stops."""
    started = time.monotonic()
    try:
        auth = {"token": secrets.admin_token(db_path), "user": "gpusession hub"}
        open_leases = [lease for lease in link.call("leases", auth).result(30) if lease["state"] != LeaseState.ENDED]
        for lease in open_leases:
            link.call("release", lease["lease_id"], "hub stopped", auth=auth).result(30)
            log.info("Closed lease %d of %s (the hub stopped)", lease["lease_id"], lease["user"])
        free = link.call("cluster").result(30)
        log.info("Closed %d leases in %.1f s; Ray shows %g of %g GPUs free", len(open_leases),
                 time.monotonic() - started, free["gpus_free"], free["gpus_total"])
    except Exception:  # the head stops anyway; the broker closes them at its next start
        log.exception("Could not close the open leases before stopping")


def _say(message: dict) -> None:
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    raise SystemExit(serve(int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]),
                           sys.argv[4] if len(sys.argv) > 4 else None))
