"""`python -m gpusession.hub.service GPUS POLICY_JSON`: the hub's cluster service, one process
run as the service account (never root, never a user): a local Ray head (so every rank runs as
this account) and the broker, created here with the hub's policy before any user can reach it.

    stdout, one line once both are up:  {"ready": {"address": ..., "gpus": 4, "logical": true, "db_path": ...}}
                                   or:  {"failed": "..."}
It stops the broker's bridge and the head when its stdin closes or it gets SIGTERM / SIGINT.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from jupyter_ext.brokerlink import BrokerLink

from ..cluster import localhead

log = logging.getLogger("gpusession.hub.service")


def serve(gpus: int, policy: dict) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    head = link = None
    try:
        head, _ = localhead.start(gpus=gpus)
        link = BrokerLink(env={**os.environ, **head.client_env()}, policy=policy, log=log)
        info = link.start()
        _say({"ready": {"address": head.address, "gpus": head.gpus, "logical": head.logical,
                        "db_path": info.get("db_path") or policy.get("db_path"), "pid": head.pid}})
        stop.wait()
        return 0
    except Exception as exc:  # one line for the hub; the service's log has the traceback
        log.exception("The hub's cluster service failed")
        _say({"failed": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        if link is not None:
            link.stop()
        if head is not None:
            localhead.stop(pid=head.pid)


def _say(message: dict) -> None:
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    raise SystemExit(serve(int(sys.argv[1]), json.loads(sys.argv[2])))
