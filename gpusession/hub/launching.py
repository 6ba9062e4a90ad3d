"""The hub's side of the root launcher (gpusession/launcher/): start it, as root, before the
cluster service, with a clean environment (no Ray token, no admin token: it holds no secret and
passes none on), and stop it by its pid on every path. Its socket is where the service's worker
actors ask for ranks (GPUSESSION_LAUNCHER in the service's environment)."""
from __future__ import annotations

import json
import selectors
import socket
import subprocess
from pathlib import Path

from ..cluster.localhead import terminate
from .plan import HubLayout

STOP_TIMEOUT_S = 30.0


class LauncherFailed(RuntimeError):
    """The launcher did not start; the message says why and where its log is."""


def launcher_dir(layout: HubLayout) -> Path:
    return layout.state / "launcher"


def start_launcher(layout: HubLayout, service_user: str, min_uid: int, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """The running launcher and its socket's path."""
    log_path = layout.hub_dir / "launcher.log"
    log = open(log_path, "w")
    env = {"PATH": f"{layout.bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    # Its owner socket: if the hub dies without stopping it (SIGKILL), the launcher sees it close
    # and ends, with every rank it started
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([str(layout.python), "-m", "gpusession.launcher", "--dir", str(launcher_dir(layout)),
                             "--service-user", service_user, "--min-uid", str(min_uid),
                             "--owner-fd", str(theirs.fileno())],
                            env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                            text=True, start_new_session=True, close_fds=True, pass_fds=[theirs.fileno()])
    theirs.close()
    log.close()
    _owners[proc.pid] = ours
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(timeout=timeout_s) else ""
    answer = json.loads(line) if line.strip().startswith("{") else {"failed": line.strip() or "no answer"}
    if "ready" not in answer:
        stop_launcher(proc)
        raise LauncherFailed(f"The launcher (root's, which starts each rank as its user) did not start: "
                             f"{answer.get('failed')}. Its log: {log_path}")
    return proc, answer["ready"]["socket"]


_owners: dict[int, socket.socket] = {}  # each launcher's owner socket, held while it runs


def stop_launcher(proc: subprocess.Popen | None) -> None:
    """SIGTERM (it kills every rank it started, then exits), then SIGKILL by its pid."""
    if proc is None:
        return
    owner = _owners.pop(proc.pid, None)
    if owner is not None:
        owner.close()  # it stops by itself: kills its ranks, removes its cgroups and socket
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
            return
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        terminate(proc.pid, timeout_s=1)
