"""PURE: what `gpusession hub` lays out and runs, from its options; no process, file or user here.

    PREFIX (scripts/setup --hub, world-readable)   venv/ (Debian's python3, gpusession, JupyterLab, JupyterHub)
                                                   proxy/node_modules/.bin/configurable-http-proxy
    STATE (root, 0755)                             cluster/ (the service account's, 0700): the broker's ledger,
                                                            admin_token and identity_key, the Ray head's log
                                                   hub/ (root's, 0700): JupyterHub's config, database, cookie
                                                            secret, Ray's token, the logs
    /tmp/gsh-<service account>                     Ray's temp and session directories (the account's)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PREFIX = Path("/opt/gpusession-hub")
DEFAULT_STATE = Path("/var/lib/gpusession-hub")
DEFAULT_SERVICE_USER = "gpusession"
NOT_SET_UP = "{path} is missing: run `scripts/setup --hub` (it installs the hub's environment under {prefix}), then try again."


@dataclass(frozen=True)
class HubLayout:
    prefix: Path
    state: Path
    service_user: str

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
        return Path("/tmp") / f"gsh-{self.service_user}"

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
    def ray_token_path(self) -> Path:
        return self.hub_dir / "ray_auth_token"

    @property
    def config_path(self) -> Path:
        return self.hub_dir / "jupyterhub_config.py"

    def missing(self) -> list[str]:
        """PURE over the given existing-paths check: what `scripts/setup --hub` should have made."""
        return [str(p) for p in (self.python, self.proxy)]


@dataclass(frozen=True)
class HubOptions:
    ip: str
    port: int
    admins: tuple[str, ...]
    gpus: int
    hub_api_port: int
    proxy_api_port: int
    policy: dict = field(default_factory=dict)


def broker_policy(layout: HubLayout, options: HubOptions) -> dict:
    """The broker's config: the ledger in the service's directory, signed identities required."""
    return {**options.policy, "db_path": str(layout.db_path), "require_signed_identity": True}


def user_environment(layout: HubLayout, *, ray_address: str, ray_token: str) -> dict[str, str]:
    """What every user server (and so every kernel and terminal) gets besides its signed identity."""
    return {"RAY_ADDRESS": ray_address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token,
            "PATH": f"{layout.bin_dir}:/usr/local/bin:/usr/bin:/bin"}


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
        "Spawner.environment": user_env,
        # one flag per admin: jupyterhub-singleuser reads a JSON list as one name
        "Spawner.args": [f"--GPUSession.admin_users={name}" for name in admins],
        "Spawner.start_timeout": 300, "Spawner.http_timeout": 300,  # a loaded machine starts servers slowly
    }
    lines = ["# Written by `gpusession hub` at each start; edit its options instead.",
             "from gpusession.hub.spawnhook import pre_spawn_hook", ""]
    for name, value in settings.items():
        lines.append(f"c.{name} = {value!r}")
    lines.append(f"c.Spawner.pre_spawn_hook = pre_spawn_hook(key_path={str(layout.identity_key_path)!r}, "
                 f"admin_token_path={str(layout.admin_token_path)!r}, admins={admins!r})")
    return "\n".join(lines) + "\n"
