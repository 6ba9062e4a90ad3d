"""How a gateway acts for a connected caller at the broker.

    ServiceKeys   the hub's gateway: the caller's name signed with the broker's identity key (the
                  gateway holds it; the caller never does), the admin token only for a caller the
                  configuration names admin
    OwnIdentity   a user's own gateway (usergateway.py): every caller is that user, acting with the
                  identity the user's kernels carry (GPUSESSION_USER / GPUSESSION_IDENTITY, as an
                  in-process run does), never an admin token
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..identity import Identity, sign
from .server import Caller


class Acting(Protocol):
    def identity_for(self, caller: Caller) -> Identity: ...

    def admin_token_for(self, caller: Caller) -> str | None: ...


@dataclass(frozen=True)
class ServiceKeys:
    identity_key: bytes = field(repr=False)
    admin_token: str = field(repr=False)

    def identity_for(self, caller: Caller) -> Identity:
        return Identity(caller.user, sign(caller.user, self.identity_key))

    def admin_token_for(self, caller: Caller) -> str | None:
        return self.admin_token if caller.admin else None


@dataclass(frozen=True)
class OwnIdentity:
    identity: Identity = field(repr=False)

    def identity_for(self, caller: Caller) -> Identity:
        return self.identity

    def admin_token_for(self, caller: Caller) -> str | None:
        return None


def identity_of(caller: Caller, keys: Acting) -> Identity:
    return keys.identity_for(caller)


def admin_token_for(caller: Caller, keys: Acting) -> str | None:
    return keys.admin_token_for(caller)
