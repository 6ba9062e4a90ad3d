"""`gpusession hub`: start the cluster service as the service account, then JupyterHub as root;
print the URL once the Hub answers; on Ctrl-C or SIGTERM the cluster service closes every open
lease at once (users' GPUs are free in Ray within seconds), JupyterHub stops (it stops every user's
server first), then the cluster service (the broker's bridge, then the Ray head)."""
from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..cluster.localhead import first_line, terminate
from . import accounts
from ..launcher import rootfs
from .launching import LauncherFailed, start_launcher, stop_launcher
from .nodeplan import join_command
from .plan import (INSECURE_WARNING, NOT_SET_UP, HubLayout, HubOptions, broker_policy, culling_line,
                   gateway_settings, jupyterhub_config, user_environment)

STOP_TIMEOUT_S = 60.0


class HubStopped(Exception):
    """SIGTERM arrived: stop as on Ctrl-C."""


def say(line: str) -> None:
    print(f"gpusession hub: {line}", flush=True)


def run_hub(layout: HubLayout, options: HubOptions, *, ready_timeout_s: float = 600.0) -> int:
    problem = _refusal(layout)
    if problem:
        say(problem)
        return 2
    signal.signal(signal.SIGTERM, _raise_stopped)
    service = hub = launcher = None
    try:
        account = accounts.ensure_service_user(layout.service_user, layout.cluster_dir)
        accounts.prepare_directories(layout, account)
        token = accounts.ray_token()
        # root's launcher first: the service's worker actors ask it for every rank, run as its user
        launcher, launcher_socket = start_launcher(layout, account.pw_name, options.min_uid, ready_timeout_s)
        say(f"the launcher runs (pid {launcher.pid}): ranks run as their users (uid {options.min_uid} and up)")
        say(f"starting the cluster as {layout.service_user} (its log: {layout.hub_dir / 'service.log'})...")
        service, ready = start_service(layout, options, account, token, ready_timeout_s, launcher=launcher_socket)
        kind = "logical GPUs (training runs on the CPU)" if ready["logical"] else "GPUs"
        say(f"cluster ready: {ready['gpus']} {kind}, Ray at {ready['address']}, run as {layout.service_user}")
        if options.ray_ip:
            keep_ray_token(layout, token)
            say(f"other GPU nodes join with:\n  {join_command(layout, ready['address'])}")
        layout.config_path.write_text(jupyterhub_config(
            layout, options, user_env=user_environment(layout)))
        say(culling_line(options.culling))
        if options.insecure_http:
            say(INSECURE_WARNING.format(ip=options.ip))
        hub = start_jupyterhub(layout)
        url = options.url
        if not wait_answering(hub, f"{url}hub/api/", ready_timeout_s):
            say(f"JupyterHub did not come up; the end of its log ({layout.hub_dir / 'jupyterhub.log'}):\n"
                f"{_tail(layout.hub_dir / 'jupyterhub.log')}")
            return 1
        say(f"ready: {url} (admins: {', '.join(sorted(options.admins)) or 'none'}; users log in with their "
            "Unix name and password)")
        say("Ctrl-C stops every user's server, then the cluster.")
        return hub.wait()
    except (KeyboardInterrupt, HubStopped):
        say("stopping the users' servers, then the cluster...")
        return 0
    except (accounts.HubSetupError, rootfs.UnsafePath, ServiceFailed, LauncherFailed) as exc:
        say(str(exc))
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        try:
            stop(hub, service)
        finally:
            stop_launcher(launcher)  # by its pid, after the service: no rank is asked for any more
            if options.ray_ip:
                layout.ray_token_path.unlink(missing_ok=True)  # this start's token is useless now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def keep_ray_token(layout: HubLayout, token: str) -> None:
    """Ray's token of this start, for `gpusession hub node` on other machines: root's alone (0600 in
    root's 0700 hub/, checked at the start), written anew without following a symlink."""
    layout.ray_token_path.unlink(missing_ok=True)
    fd = os.open(layout.ray_token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")


class ServiceFailed(RuntimeError):
    """The cluster service did not come up."""


def start_service(layout: HubLayout, options: HubOptions, account, ray_token: str,
                  timeout_s: float, *, launcher: str | None = None) -> tuple[subprocess.Popen, dict]:
    env = {"PATH": f"{layout.bin_dir}:/usr/bin:/bin", "HOME": str(layout.cluster_dir), "LANG": "C.UTF-8",
           "GPUSESSION_HOME": str(layout.cluster_dir), "RAY_TMPDIR": str(layout.ray_tmp),
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token, "USER": account.pw_name}
    if launcher:  # its worker actors (Ray's workers inherit this) ask root's launcher for ranks
        env["GPUSESSION_LAUNCHER"] = launcher
    log = open(layout.hub_dir / "service.log", "w")
    command = [str(layout.python), "-m", "gpusession.hub.service", str(options.gpus),
               json.dumps(broker_policy(layout, options)), json.dumps(gateway_settings(layout, options)),
               *([options.ray_ip] if options.ray_ip else [])]
    # umask 077: Ray's files and sockets are the service account's alone (users reach the gateway)
    proc = subprocess.Popen(command, env=env, cwd=str(layout.cluster_dir), user=account.pw_uid,
                            group=account.pw_gid, extra_groups=[], umask=0o077, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    log.close()
    line = first_line(proc, timeout_s)
    answer = json.loads(line) if line.strip().startswith("{") else {"failed": line.strip() or "no answer"}
    if "ready" not in answer:
        stop(None, proc)
        raise ServiceFailed(f"The cluster did not start: {answer.get('failed')}. The service's log: "
                            f"{layout.hub_dir / 'service.log'}\n{_tail(layout.hub_dir / 'service.log')}")
    return proc, answer["ready"]


def start_jupyterhub(layout: HubLayout) -> subprocess.Popen:
    log = open(layout.hub_dir / "jupyterhub.log", "w")
    env = {**os.environ, "PATH": f"{layout.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    for secret in ("RAY_AUTH_TOKEN", "GPUSESSION_ADMIN_TOKEN"):
        env.pop(secret, None)
    proc = subprocess.Popen([str(layout.python), "-m", "jupyterhub", "-f", str(layout.config_path)],
                            cwd=str(layout.hub_dir), env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc


def wait_answering(proc: subprocess.Popen, url: str, timeout_s: float) -> bool:
    """True once the Hub's root API answers THROUGH the proxy (200 and its JSON version).

    The proxy answers before the Hub has added its own route: until then every request gets the
    proxy's 404, a login included. "Ready" printed on that 404 sent the first users to a hub that
    could not log them in, so only the Hub's own answer counts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if hub_answers(url):
            return True
        time.sleep(0.5)
    return False


def hub_answers(url: str) -> bool:
    # Our own Hub on our own address: its certificate may be one a browser is told to trust by hand
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as answer:
            return answer.status == 200 and "version" in json.loads(answer.read() or b"{}")
    except (OSError, ValueError):  # HTTPError (the proxy's 404/503) is an OSError
        return False


def stop(hub: subprocess.Popen | None, service: subprocess.Popen | None) -> None:
    """JupyterHub first (SIGTERM: it stops the users' servers and its proxy), then the service.
    The service closes every lease as JupyterHub starts stopping (SIGUSR1): stopping the users'
    servers takes seconds, and their GPUs must be free in Ray within 5 s of the stop (issue 19)."""
    if service is not None and service.poll() is None:
        service.send_signal(signal.SIGUSR1)
    if hub is not None and hub.poll() is None:
        hub.send_signal(signal.SIGTERM)
        try:
            hub.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            terminate(hub.pid, timeout_s=1)
    if service is not None and service.poll() is None:
        try:
            service.stdin.close()  # the service stops the bridge, then the Ray head
            service.wait(timeout=STOP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            terminate(service.pid, timeout_s=5)


def _refusal(layout: HubLayout) -> str | None:
    if os.geteuid() != 0:
        return ("gpusession hub runs as root (it starts each user's server as that user, as JupyterHub's "
                "LocalProcessSpawner needs): run it with sudo.")
    for path in layout.missing():
        if not Path(path).exists():
            return NOT_SET_UP.format(path=path, prefix=layout.prefix)
    return None


def _raise_stopped(signum, frame) -> None:
    raise HubStopped()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
