"""The broker's two secrets, kept beside its database (mode 0600), never given to user kernels:
the admin token (for admin operations) and the identity key (to verify server-signed users)."""
from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path


def _read_or_create(path: Path, nbytes: int) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(nbytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return value


def admin_token_path(db_path: str | Path) -> Path:
    return Path(db_path).with_name("admin_token")


def identity_key_path(db_path: str | Path) -> Path:
    return Path(db_path).with_name("identity_key")


def admin_token(db_path: str | Path) -> str:
    return _read_or_create(admin_token_path(db_path), 24)


def identity_key(db_path: str | Path) -> bytes:
    return _read_or_create(identity_key_path(db_path), 32).encode()


def token_matches(given, expected: str) -> bool:
    """Whether `given` is the token; anything not a non-empty string (a list, a number, None) is not."""
    return isinstance(given, str) and bool(given) and hmac.compare_digest(given.encode(), expected.encode())
