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


def sign(user: str, key: bytes) -> str:
    return hmac.new(key, user.encode("utf-8"), hashlib.sha256).hexdigest()


def verify(identity: Identity, key: bytes) -> bool:
    if not identity.signature:
        return False
    return hmac.compare_digest(identity.signature, sign(identity.user, key))
