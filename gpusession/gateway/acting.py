"""How the service acts for a connected caller at the broker: the caller's name signed with the
broker's identity key (the gateway holds it; the caller never does), and the admin token only
for a caller the configuration names admin."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..identity import Identity, sign
from .server import Caller


@dataclass(frozen=True)
class ServiceKeys:
    identity_key: bytes = field(repr=False)
    admin_token: str = field(repr=False)


def identity_of(caller: Caller, keys: ServiceKeys) -> Identity:
    return Identity(caller.user, sign(caller.user, keys.identity_key))


def admin_token_for(caller: Caller, keys: ServiceKeys) -> str | None:
    return keys.admin_token if caller.admin else None
