"""Who is asking: the user name a kernel runs as, and the server-signed proof of it.

Ray OSS has no per-user access control, so this is a convention that quotas rely on, not a
security boundary against code that talks to Ray directly (see docs/admin/security.md).
A Jupyter server that starts kernels puts GPUSESSION_USER and GPUSESSION_IDENTITY (an HMAC of
the user name under a key only the server and the broker hold) into each kernel's environment;
with `require_signed_identity` the broker refuses requests whose signature does not verify.
"""
from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import time
from dataclasses import dataclass

USER_ENV = "GPUSESSION_USER"
SIGNATURE_ENV = "GPUSESSION_IDENTITY"


@dataclass(frozen=True)
class Identity:
    user: str
    signature: str | None = None


def current_user() -> str:
    """GPUSESSION_USER, else JupyterHub's user, else the OS user."""
    for name in (USER_ENV, "JUPYTERHUB_USER"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return getpass.getuser()


def current_identity() -> Identity:
    return Identity(current_user(), os.environ.get(SIGNATURE_ENV) or None)


SIGNED_FOR_S = 7 * 24 * 3600  # a server's signature: the Hub signs at each spawn; restart after a week
_VERSION = "v2"


def sign(user: str, key: bytes, *, valid_for_s: float = SIGNED_FOR_S, now: float | None = None) -> str:
    """`v2.<expires>.<HMAC-SHA256 of the name and the expiry>`: proof that whoever holds the key
    (the Hub, a Jupyter server on the head, the gateway) vouches for `user` until `expires`
    (epoch seconds). A leaked signature stops working then; a plain HMAC without an expiry (the
    old form) is no longer accepted."""
    expires = int((time.time() if now is None else now) + valid_for_s)
    return f"{_VERSION}.{expires}.{_mac(user, expires, key)}"


def _mac(user: str, expires: int, key: bytes) -> str:
    return hmac.new(key, f"{user}\n{expires}".encode("utf-8"), hashlib.sha256).hexdigest()


def expiry(signature: str | None) -> int | None:
    """PURE: when a signature stops working (epoch seconds), or None when it is not one of ours."""
    parts = (signature or "").split(".")
    if len(parts) != 3 or parts[0] != _VERSION or not parts[1].isdigit():
        return None
    return int(parts[1])


def verify(identity: Identity, key: bytes, *, now: float | None = None) -> bool:
    """The signature is the key holder's for this user, and has not expired."""
    expires = expiry(identity.signature)
    if expires is None or expires <= (time.time() if now is None else now):
        return False
    return hmac.compare_digest(identity.signature.split(".")[2], _mac(identity.user, expires, key))


def refusal(identity: Identity, key: bytes, *, now: float | None = None, expired_ok: bool = False) -> str | None:
    """PURE: why the broker refuses this identity (the sentence a user reads), or None.
    `expired_ok`: a genuine signature that has expired still counts (for a lease granted while it
    was valid: its run may go on and end, and its GPUs are always released)."""
    now = time.time() if now is None else now
    if verify(identity, key, now=now):
        return None
    expires = expiry(identity.signature)
    if expires is not None and expires <= now and hmac.compare_digest(
            identity.signature.split(".")[2], _mac(identity.user, expires, key)):
        if expired_ok:
            return None
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires))
        return (f"The signed identity of {identity.user!r} expired at {when}: a Jupyter server's signature "
                "lasts a week. Restart your server (JupyterHub: File > Hub Control Panel > Stop My Server, "
                "then start it) for a fresh one.")
    return (f"The identity {identity.user!r} is not signed by the Jupyter server; this cluster requires "
            "signed identities. Start the kernel from the cluster's Jupyter server.")
