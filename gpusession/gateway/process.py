"""Start and stop the gateway process (gateway/main.py) for a service that runs it: the hub's
cluster service, as its own account. The gateway reads its stdin until it closes, so it never
outlives the process that started it; stop() ends it by pid on every path."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..cluster.localhead import first_line, terminate

READY_TIMEOUT_S = 300.0  # a first `ray.init` on a loaded 2-core machine takes tens of seconds
IMPORT_ROOT = str(Path(__file__).resolve().parent.parent.parent)


class GatewayFailed(RuntimeError):
    """The gateway did not come up; the message has its own words."""


def start(*, env: dict, socket: str, db_path: str, admins: list[str], detach: dict | None = None,
          call_bytes: int | None = None, timeout_s: float = READY_TIMEOUT_S, stderr=None) -> subprocess.Popen:
    """The gateway, serving at `socket` once this returns; GatewayFailed (and nothing left running) if not.
    detach: {"max_duration_s", "retention_s"}, the admin's policy for detached runs (None: out of the box);
    call_bytes: what one account's calls may hold of its memory at a time (None: a quarter of the machine's)."""
    flags = [] if not detach else ["--detach-max-duration", str(detach["max_duration_s"]),
                                   "--detach-retention", str(detach["retention_s"])]
    if call_bytes is not None:
        flags += ["--call-bytes-per-user", str(call_bytes)]
    proc = subprocess.Popen([sys.executable, "-m", "gpusession.gateway.main", *flags, socket, db_path, *admins],
                            env=env, cwd=IMPORT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)
    line = first_line(proc, timeout_s)
    try:
        answer = json.loads(line)
    except ValueError:
        answer = {"failed": line.strip() or f"it exited (status {proc.poll()}) without a word"}
    if not isinstance(answer, dict) or "ready" not in answer:
        stop(proc)
        raise GatewayFailed(f"The gpusession gateway did not start: {answer.get('failed') if isinstance(answer, dict) else line}")
    return proc


def stop(proc: subprocess.Popen, *, timeout_s: float = 10.0) -> None:
    """End the gateway we started: close its stdin (it removes its socket and exits), then by pid."""
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            terminate(proc.pid, timeout_s=timeout_s)
    proc.wait()

