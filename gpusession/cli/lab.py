"""`gpusession lab`: JupyterLab with the gpusession extension and its embedded cluster.

    $ gpusession lab
    gpusession lab: starting JupyterLab on port 8888 (its log: ~/.gpusession/lab.log)...
    gpusession lab: JupyterLab is up: http://localhost:8888/lab?token=3f9c...
    gpusession lab: starting the cluster (12 s)...
    gpusession lab: cluster ready: 4 logical GPUs (training runs on the CPU). Admin page: http://localhost:8888/gpusession/admin
    gpusession lab: Ctrl-C stops JupyterLab, its kernels and the cluster it started.

It runs `python -m jupyterlab` in the foreground with the extension enabled on the command line
(so an editable install without the config file works too), a token it makes (in the server's
environment, never on its command line; its log is private), and --allow-root
when run as root (as in a container). The URL is printed once the server answers; the cluster
comes up behind it (the page and every kernel wait for it). Once JupyterLab has ended, the
folders its cluster made in the temporary folder (the node host's warm folder, the ranks' scratch
root) go too: Ray ended the processes that would have removed them.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..cluster.localhead import Bringup
from ..cluster.raycluster import state_dir
from ..run.node import leftovers

NOT_INSTALLED = ("JupyterLab is not installed in this environment. Install it with "
                 "`pip install 'gpusession[lab]'` (scripts/setup does), then run `gpusession lab` again.")
DEFAULT_PORT = 8888
TOKEN_ENV = "JUPYTER_TOKEN"


@dataclass(frozen=True)
class LabPlan:
    """What `gpusession lab` runs: the command line, what it adds to the environment (the token),
    and the URLs it will print."""

    command: list[str]
    port: int
    token: str
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/lab?token={self.token}"

    @property
    def admin_url(self) -> str:
        return f"http://localhost:{self.port}/gpusession/admin?token={self.token}"

    def api(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"


def plan(*, port: int | None, ip: str, gpus: int | None, open_browser: bool, notebook_dir: str | None,
         extra: list[str], is_root: bool, token: str | None = None) -> LabPlan:
    """PURE: the jupyter lab command for these choices."""
    chosen_port = port or DEFAULT_PORT
    token = token or secrets.token_hex(24)
    # The token goes in the environment (JUPYTER_TOKEN, which Jupyter reads), never on the command
    # line: any account on the machine may read a process's command line, only its own its environment.
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.port={chosen_port}", "--ServerApp.port_retries=0",
               f"--ServerApp.ip={ip}", "--ServerApp.jpserver_extensions=gpusession=True",
               f"--ServerApp.open_browser={open_browser}"]
    if gpus:
        command.append(f"--GPUSession.local_gpus={gpus}")
    if notebook_dir:
        command.append(f"--ServerApp.root_dir={notebook_dir}")
    if is_root:
        command.append("--allow-root")  # Jupyter refuses root otherwise; containers often run as root
    return LabPlan(command + list(extra), chosen_port, token, {TOKEN_ENV: token})


def private_log(path: Path):
    """The log file, emptied, readable and writable by this account alone (also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "w")


def free_port(preferred: int = DEFAULT_PORT) -> int:
    """The preferred port if nothing listens there, else one the OS picks."""
    for candidate in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise OSError("no free port")


def jupyterlab_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("jupyterlab") is not None


def run_lab(*, port: int | None, ip: str, gpus: int | None, open_browser: bool, notebook_dir: str | None,
            extra: list[str], ready_timeout_s: float = 300.0) -> int:
    if not jupyterlab_installed():
        print(f"gpusession lab: {NOT_INSTALLED}", file=sys.stderr)
        return 1
    chosen = plan(port=port or free_port(), ip=ip, gpus=gpus, open_browser=open_browser,
                  notebook_dir=notebook_dir, extra=extra, is_root=hasattr(os, "geteuid") and os.geteuid() == 0)
    home = state_dir()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "lab.log"
    say(f"starting JupyterLab on port {chosen.port} (its log: {log_path})...")
    before = leftovers.Snapshot.now()
    try:
        with private_log(log_path) as log:  # Jupyter writes its URL, token included, into it
            proc = subprocess.Popen(chosen.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **chosen.env})
            try:
                if watch(proc, chosen, log_path, ready_timeout_s):
                    say("Ctrl-C stops JupyterLab, its kernels and the cluster it started.")
                return proc.wait()
            except KeyboardInterrupt:
                say("stopping JupyterLab (its kernels, then the cluster it started)...")
                proc.send_signal(signal.SIGTERM)  # Jupyter's own clean shutdown, no confirmation prompt
                try:
                    return proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    return proc.wait()
    finally:
        # the node host's warm folder and the ranks' scratch root in the temporary folder: Ray ended
        # the host, which cannot remove its own (leftovers.py); what a live process holds stays
        before.remove_new()


def watch(proc: subprocess.Popen, chosen: LabPlan, log_path: Path, timeout_s: float) -> bool:
    """Print the URL once JupyterLab answers, then the cluster's progress until it is ready."""
    deadline = time.monotonic() + timeout_s
    while _get(chosen, "api/status") is None:
        if proc.poll() is not None:
            say(f"JupyterLab exited with status {proc.returncode} before it answered. "
                f"The end of its log ({log_path}):\n{_tail(log_path)}")
            return False
        if time.monotonic() > deadline:
            say(f"JupyterLab did not answer within {timeout_s:.0f} s; see {log_path}.")
            return False
        time.sleep(0.25)
    say(f"JupyterLab is up: {chosen.url}")
    said = 0.0
    while proc.poll() is None and time.monotonic() < deadline:
        answer = _get(chosen, "gpusession/api/cluster")
        if answer is not None and "gpus_total" in answer:
            kind = " logical GPUs (training runs on the CPU)" if answer.get("logical_gpus") else " GPUs"
            say(f"cluster ready: {answer['gpus_total']:g}{kind}. Admin page: {chosen.admin_url}")
            return True
        if answer is not None and answer.get("state") == Bringup.FAILED:
            say(answer.get("message", "the cluster did not start"))
            return True  # JupyterLab still runs; the page says the same
        if answer is not None and answer.get("state") == Bringup.STARTING and time.monotonic() - said >= 10:
            said = time.monotonic()
            say(f"starting the cluster ({answer.get('elapsed_s', 0)} s)...")
        time.sleep(0.5)
    return proc.poll() is None


def say(line: str) -> None:
    print(f"gpusession lab: {line}", flush=True)


def _get(chosen: LabPlan, path: str) -> dict | None:
    """The JSON answer of the server (an error's JSON too), or None when it does not answer."""
    request = urllib.request.Request(chosen.api(path), headers={"Authorization": f"token {chosen.token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            return json.loads(error.read() or b"{}")
        except ValueError:
            return {}
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
