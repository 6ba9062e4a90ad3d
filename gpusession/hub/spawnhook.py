"""The one place a Hub signs who a user server belongs to: `gpusession hub` and the shipped z2jh
values (cluster/jupyterhub-values.yaml) both install `pre_spawn_hook` from here.

The Hub reads the broker's identity key when it spawns a server and puts the user's signed name
into the server's environment; the server (running as the user, who can read its environment)
never holds the key, so it can vouch only for its own user. Admins' servers also get the broker's
admin token: an admin can act for anyone anyway.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..identity import SIGNATURE_ENV, SIGNED_FOR_S, USER_ENV, sign
from ..launcher import rootfs

ADMIN_TOKEN_ENV = "GPUSESSION_ADMIN_TOKEN"


def identity_environment(user: str, *, key: bytes, admin_token: str | None,
                         valid_for_s: float = SIGNED_FOR_S) -> dict[str, str]:
    """PURE: the variables a server of `user` gets: its name, its signature (good for
    `valid_for_s` from now: the server must be restarted after that), the token if admin."""
    env = {USER_ENV: user, SIGNATURE_ENV: sign(user, key, valid_for_s=valid_for_s)}
    if admin_token is not None:
        env[ADMIN_TOKEN_ENV] = admin_token
    return env


def sign_spawner(spawner, *, key_path: str | Path, admin_token_path: str | Path, admins: Iterable[str],
                 owner: str | None = None, valid_for_s: float = SIGNED_FOR_S) -> None:
    """Put the signed identity of `spawner.user` (and, for an admin, the admin token) into the
    environment JupyterHub gives the server it is about to spawn. The files are read at each
    spawn, so a key rotated on disk applies to the next server. They are read as rootfs reads a
    secret: never a FIFO (which would hang every login) or an empty file; with `owner` (the
    service account, under `gpusession hub`) never through a symlink and only if that account
    owns them privately. A refusal fails this spawn with a message naming the file."""
    user = spawner.user.name
    owner_uid = rootfs.uid_of(owner) if owner else None
    key = rootfs.read_secret(Path(key_path), owner=owner_uid).encode()
    token = rootfs.read_secret(Path(admin_token_path), owner=owner_uid) if user in set(admins) else None
    spawner.environment.update(identity_environment(user, key=key, admin_token=token, valid_for_s=valid_for_s))


def pre_spawn_hook(*, key_path: str | Path, admin_token_path: str | Path,
                   admins: Iterable[str], owner: str | None = None,
                   valid_for_s: float = SIGNED_FOR_S) -> Callable[[object], None]:
    """A `c.Spawner.pre_spawn_hook` that signs every server JupyterHub spawns (sign_spawner); each
    signature is good for `valid_for_s` seconds (default a week): a server older than that must be
    restarted before it can ask for GPUs again."""
    admin_names = frozenset(admins)
    if not isinstance(valid_for_s, (int, float)) or isinstance(valid_for_s, bool) or not 60 <= valid_for_s <= 10 * 365 * 86400:
        raise ValueError(f"pre_spawn_hook: valid_for_s must be a number of seconds from 60 to ten years; got {valid_for_s!r}.")

    def gpusession_identity(spawner) -> None:
        sign_spawner(spawner, key_path=key_path, admin_token_path=admin_token_path, admins=admin_names, owner=owner,
                     valid_for_s=valid_for_s)

    return gpusession_identity
