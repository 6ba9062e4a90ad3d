"""PURE: what `gpusession hub` lays out and runs, from its options; no process, file or user here.

    PREFIX (scripts/setup --hub, world-readable)   venv/ (Debian's python3, gpusession, JupyterLab, JupyterHub)
                                                   proxy/node_modules/.bin/configurable-http-proxy
    STATE (root, 0755)                             cluster/ (the service account's, 0700): the broker's ledger,
                                                            admin_token and identity_key, the Ray head's log
                                                   gateway/ (the service account's, 0755): gateway.sock, the
                                                            one door users have (mode 0666; the caller
                                                            is named by SO_PEERCRED)
                                                   hub/ (root's, 0700): JupyterHub's config, database, cookie
                                                            secret, the logs
    /tmp/gsh-<service account>                     Ray's temp and session directories (the account's, 0700:
                                                   no user reaches Ray's sockets)
    STATE/hub/ray_token                            with --ray-ip only: Ray's token of this start (root's,
                                                   0600), for `gpusession hub node` on other machines
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from ..gateway.keeping import DetachPolicy

DEFAULT_PREFIX = Path("/opt/gpusession-hub")
DEFAULT_STATE = Path("/var/lib/gpusession-hub")
DEFAULT_SERVICE_USER = "gpusession"
NOT_SET_UP = "{path} is missing: run `scripts/setup --hub` (it installs the hub's environment under {prefix}), then try again."


@dataclass(frozen=True)
class HubLayout:
    prefix: Path
    state: Path
    service_user: str
    temp_dir: Path | None = None  # Ray's temporary directory, when not /tmp/gsh-<service account>

    @property
    def python(self) -> Path:
        return self.prefix / "venv" / "bin" / "python"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "venv" / "bin"

    @property
    def proxy(self) -> Path:
        return self.prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"

    @property
    def cluster_dir(self) -> Path:
        return self.state / "cluster"

    @property
    def hub_dir(self) -> Path:
        return self.state / "hub"

    @property
    def ray_tmp(self) -> Path:
        # Short: Ray puts unix sockets under it, whose paths may not exceed 107 bytes.
        return self.temp_dir or Path("/tmp") / f"gsh-{self.service_user}"

    @property
    def ray_token_path(self) -> Path:
        return self.hub_dir / "ray_token"

    @property
    def gateway_dir(self) -> Path:
        return self.state / "gateway"

    @property
    def gateway_socket(self) -> Path:
        return self.gateway_dir / "gateway.sock"

    @property
    def db_path(self) -> Path:
        return self.cluster_dir / "ledger.db"

    @property
    def admin_token_path(self) -> Path:
        return self.cluster_dir / "admin_token"

    @property
    def identity_key_path(self) -> Path:
        return self.cluster_dir / "identity_key"

    @property
    def config_path(self) -> Path:
        return self.hub_dir / "jupyterhub_config.py"

    def missing(self) -> list[str]:
        """PURE over the given existing-paths check: what `scripts/setup --hub` should have made."""
        return [str(p) for p in (self.python, self.proxy)]


DEFAULT_CULL_IDLE_AFTER_S = 3600  # z2jh's default: a server nobody used for an hour is stopped
MIN_CULL_IDLE_AFTER_S = 10


@dataclass(frozen=True)
class Culling:
    """jupyterhub-idle-culler's settings, and how fresh the activity it reads must be.

    idle_after_s: a server inactive that long is stopped (0: no culler). A live run of one of its
    kernels counts as activity unless run_activity is False. The intervals follow from it: the
    culler looks every sixth of it (at most every 10 min), servers report their activity to the
    Hub as often (at most every 5 min, JupyterHub's default), and ask the gateway for live runs
    twice as often as they report."""

    idle_after_s: int = DEFAULT_CULL_IDLE_AFTER_S
    run_activity: bool = True

    @property
    def on(self) -> bool:
        return self.idle_after_s > 0

    @property
    def every_s(self) -> int:
        return max(1, min(600, self.idle_after_s // 6))

    @property
    def report_every_s(self) -> int:
        return max(1, min(300, self.idle_after_s // 6)) if self.on else 300

    @property
    def run_check_s(self) -> float:
        return max(1.0, self.report_every_s / 2) if self.run_activity else 0.0


@dataclass(frozen=True)
class HubOptions:
    ip: str
    port: int
    admins: tuple[str, ...]
    gpus: int
    hub_api_port: int
    proxy_api_port: int
    policy: dict = field(default_factory=dict)
    ssl_cert: Path | None = None  # with ssl_key: the Hub serves HTTPS
    ssl_key: Path | None = None
    insecure_http: bool = False  # plain HTTP on a non-loopback address, asked for by name
    min_uid: int = 1000  # the launcher starts no rank as an account below this uid (system accounts)
    culling: Culling = field(default_factory=lambda: Culling())
    ray_ip: str | None = None  # the address the Ray head advertises for other nodes; None: one machine
    detach: DetachPolicy = field(default_factory=DetachPolicy)  # detached runs' default limit and retention
    call_bytes: int | None = None  # one account's calls in the gateway's memory at a time (None: a quarter of it)

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_cert else "http"
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{scheme}://{host}:{self.port}/"


INSECURE_WARNING = ("WARNING: --insecure-http: logins on {ip} travel as plain HTTP. Users type their Unix "
                    "passwords there, and anyone on the network path can read them, and then log in to this "
                    "machine as them. Use --ssl-cert/--ssl-key, or keep the default 127.0.0.1 and reach it "
                    "through an SSH tunnel or a TLS proxy.")


def is_loopback(ip: str) -> bool:
    """PURE: whether an address (or host name) is this machine's loopback only."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:  # a host name, or "" (JupyterHub: every address)
        return False


def listen_refusal(ip: str, ssl_cert: Path | None, ssl_key: Path | None, insecure_http: bool) -> str | None:
    """PURE: why the Hub must not listen so (naming the option and what to write), or None."""
    if (ssl_cert is None) != (ssl_key is None):
        return ("--ssl-cert and --ssl-key go together: give both, the certificate and its private key "
                "(PEM files), e.g. --ssl-cert /etc/ssl/hub.pem --ssl-key /etc/ssl/hub.key.")
    if ssl_cert is not None and insecure_http:
        return "--insecure-http and --ssl-cert contradict each other: keep one."
    if ssl_cert is None and not insecure_http and not is_loopback(ip):
        return (f"--ip {ip or '(all)'} would serve logins to the network over plain HTTP, and users type their "
                "Unix passwords there. Give --ssl-cert and --ssl-key (PEM files); or --insecure-http on a "
                "network you trust; or keep the default --ip 127.0.0.1 and reach it through an SSH tunnel "
                "(ssh -L 8000:127.0.0.1:8000 HOST) or a TLS proxy.")
    return None


def broker_policy(layout: HubLayout, options: HubOptions) -> dict:
    """The broker's config: the ledger in the service's directory, signed identities required."""
    return {**options.policy, "db_path": str(layout.db_path), "require_signed_identity": True}


def user_environment(layout: HubLayout) -> dict[str, str]:
    """What every user server (and so every kernel and terminal) gets besides its signed identity:
    the gateway's socket, and no Ray address or token (users never reach Ray, issue 28)."""
    from ..gateway.client import GATEWAY_ENV

    return {GATEWAY_ENV: str(layout.gateway_socket), "PATH": f"{layout.bin_dir}:/usr/local/bin:/usr/bin:/bin"}


def gateway_settings(layout: HubLayout, options: HubOptions) -> dict:
    """What the cluster service needs to start the gateway: its socket, the admins it names and
    the admin's policy for detached runs and the bytes of one account's calls it holds at a time."""
    return {"socket": str(layout.gateway_socket), "admins": sorted(options.admins),
            "detach": {"max_duration_s": options.detach.default_max_duration_s,
                       "retention_s": options.detach.retention_s},
            "call_bytes": options.call_bytes}


def jupyterhub_config(layout: HubLayout, options: HubOptions, *, user_env: dict[str, str]) -> str:
    """The jupyterhub_config.py the hub runs with: PAM logins, one local server per Unix user."""
    admins = sorted(options.admins)
    settings = {
        "JupyterHub.ip": options.ip, "JupyterHub.port": options.port,
        "JupyterHub.hub_ip": "127.0.0.1", "JupyterHub.hub_port": options.hub_api_port,
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{options.proxy_api_port}",
        "ConfigurableHTTPProxy.command": [str(layout.proxy)],
        "JupyterHub.authenticator_class": "pam", "JupyterHub.spawner_class": "localprocess",
        "Authenticator.allow_all": True,  # every Unix account with a password may log in
        "Authenticator.admin_users": admins,
        "JupyterHub.db_url": f"sqlite:///{layout.hub_dir / 'jupyterhub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(layout.hub_dir / "jupyterhub_cookie_secret"),
        "JupyterHub.cleanup_servers": True,  # stopping the hub stops every user's server
        "JupyterHub.cleanup_proxy": True,
        "Spawner.cmd": [str(layout.bin_dir / "jupyterhub-singleuser")],
        "Spawner.default_url": "/lab",
        # how often a server tells the Hub its last activity (the culler reads the Hub's record)
        "Spawner.environment": {**user_env, "JUPYTERHUB_ACTIVITY_INTERVAL": str(options.culling.report_every_s)},
        # one flag per admin: jupyterhub-singleuser reads a JSON list as one name
        "Spawner.args": [f"--GPUSession.admin_users={name}" for name in admins]
                        + [f"--GPUSession.run_activity_s={options.culling.run_check_s:g}"],
        "Spawner.start_timeout": 300, "Spawner.http_timeout": 300,  # a loaded machine starts servers slowly
    }
    if options.ssl_cert is not None:
        settings.update({"JupyterHub.ssl_cert": str(options.ssl_cert), "JupyterHub.ssl_key": str(options.ssl_key)})
    if options.culling.on:
        settings.update(culler_settings(layout, options.culling))
    lines = ["# Written by `gpusession hub` at each start; edit its options instead.",
             "from gpusession.hub.spawnhook import pre_spawn_hook", ""]
    for name, value in settings.items():
        lines.append(f"c.{name} = {value!r}")
    # admins=[]: no server is given the admin token; admin rights are checked at the gateway
    lines.append(f"c.Spawner.pre_spawn_hook = pre_spawn_hook(key_path={str(layout.identity_key_path)!r}, "
                 f"admin_token_path={str(layout.admin_token_path)!r}, admins=[], "
                 f"owner={layout.service_user!r})")
    return "\n".join(lines) + "\n"


CULLER = "idle-culler"
CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]  # its README's


def culler_settings(layout: HubLayout, culling: Culling) -> dict:
    """jupyterhub-idle-culler as a service of the Hub, run as the service account (not root: it
    needs only its Hub token, whose scopes are the four its README names), from "/" so that no
    account's idle_culler_config.py is read."""
    command = [str(layout.python), "-m", "jupyterhub_idle_culler", f"--timeout={culling.idle_after_s}",
               f"--cull-every={culling.every_s}"]
    return {"JupyterHub.services": [{"name": CULLER, "command": command, "user": layout.service_user, "cwd": "/"}],
            "JupyterHub.load_roles": [{"name": CULLER, "scopes": CULLER_SCOPES, "services": [CULLER]}]}


def culling_line(culling: Culling) -> str:
    """PURE: what the hub says at start about stopping idle servers."""
    if not culling.on:
        return "no idle culler (--no-cull): servers run until their users or an admin stop them"
    runs = ("a live run counts as activity" if culling.run_activity
            else "a live run does not count as activity (--no-run-activity)")
    return (f"idle culler: a server with no activity for {_duration(culling.idle_after_s)} is stopped; {runs}; "
            "detached runs go on")


def _duration(seconds: int) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
