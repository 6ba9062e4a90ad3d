"""Who may do what to a lease: the caller an `auth` dict names, and the owner check.

Every broker method that names a lease takes `auth`:
    {"user": "alice", "signature": "..." or None, "job_id": "01000000"}   a kernel (its Ray job)
    {"token": "<admin token>", "user": "admin"}                          an admin
A lease belongs to its user and to the Ray job that asked for it: `wait`, `watch`, `placed` and
`release` are refused to anyone else but an admin, so another notebook (or another user) cannot
end, claim or spy on someone's run through the broker. `revoke` is the user's own (the CLI and
the admin page run as the user, in other jobs). Within one Ray cluster this is a convention the
broker enforces, not a wall: see docs/admin/security.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import NotAuthorized
from ...identity import Identity, refusal
from ..storage import secrets
from ..protocol.request import _JOB, _NAME, InvalidRequest, text

AUTH_KEYS = frozenset({"user", "signature", "job_id", "token", "by"})


@dataclass(frozen=True)
class Caller:
    user: str
    job_id: str | None
    admin: bool


@dataclass(frozen=True)
class Keys:
    admin_token: str
    identity_key: bytes
    require_signed: bool


def caller(auth: Any, keys: Keys, *, expired_ok: bool = False) -> Caller:
    """The caller `auth` proves to be; NotAuthorized if it proves nothing acceptable.
    `expired_ok`: for acting on a lease the caller already owns, an expired signature still counts."""
    if not isinstance(auth, Mapping):
        raise NotAuthorized("The call carries no credentials (auth): pass {'user': ..., 'signature': ..., "
                            "'job_id': ...} as gpusession's client does.")
    unknown = sorted(str(k) for k in auth if k not in AUTH_KEYS)
    if unknown:
        raise InvalidRequest(f"Unknown auth field {unknown[0]!r}; the fields are {', '.join(sorted(AUTH_KEYS))}.")
    token = auth.get("token")
    if token is not None and not isinstance(token, str):
        raise InvalidRequest("auth token must be a string.")
    if secrets.token_matches(token, keys.admin_token):
        user = auth.get("user")
        return Caller(user if isinstance(user, str) and user else "admin", None, True)
    user = auth.get("user")
    if not user:
        raise NotAuthorized("The request names no user.")
    text(user, "user", _NAME, "a user name of 1-256 printable characters")
    signature = text(auth.get("signature"), "signature", _NAME, "None or the server's signature", optional=True)
    job_id = text(auth.get("job_id"), "job_id", _JOB, "None or a Ray job id (hex)", optional=True)
    identity = Identity(user, signature)
    refused = refusal(identity, keys.identity_key, expired_ok=expired_ok) if keys.require_signed else None
    if refused:
        raise NotAuthorized(refused)
    return Caller(user, job_id, False)


def check_owner(row: Mapping, who: Caller, action: str) -> None:
    """Only the lease's user, from the job that asked for it, or an admin, may `action` it."""
    if who.admin:
        return
    owner_job = row.get("job_id")
    if row["user"] == who.user and (owner_job is None or owner_job == who.job_id):
        return
    if row["user"] != who.user:
        raise NotAuthorized(f"Lease {row['id']} belongs to {row['user']}; only its owner or an admin may "
                            f"{action} it (you are {who.user}). Nothing was changed.")
    raise NotAuthorized(f"Lease {row['id']} belongs to the kernel (Ray job {owner_job}) that asked for it; "
                        f"only that kernel or an admin may {action} it (this is job {who.job_id}). "
                        "Nothing was changed. To end it from elsewhere, revoke it: `gpusession revoke`.")
