"""PURE: whom the launcher starts a rank as, and who may ask it to.

The launcher runs as root and starts a user's code as that user. It never starts one as root,
as the service account (which holds the broker's secrets and runs Ray), or as a system account
(below a floor, default 1000, as Debian's first person's uid): a rank as any of those would hold
rights no user has; nor as an account in group root or in the service account's group, whose
rank would hold that group's rights (files of root's or of the service's that the group may read).
Only the service account may connect: the kernels never reach the launcher.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_UID = 1000


@dataclass(frozen=True)
class Account:
    """What the launcher needs of a passwd entry (pwd.struct_passwd has these names)."""

    pw_name: str
    pw_uid: int
    pw_gid: int
    pw_dir: str
    groups: frozenset[int] = frozenset()  # every group it is in: primary and supplementary


@dataclass(frozen=True)
class Rules:
    service_uid: int
    min_uid: int = DEFAULT_MIN_UID
    service_gid: int | None = None  # the service account's primary group


def refusal(name: str, found: Account | None, rules: Rules, node: str) -> str | None:
    """Why a rank may not be started as `name` on `node` (found: its passwd entry there, None
    when it has none); None when it may."""
    if not name:
        return (f"no account was named for the rank on node {node}: the service must say whose code it is "
                "(RankSpec.caller_account)")
    if found is None:
        return (f"the user {name!r} does not exist on node {node}: every node must know the same accounts "
                "(as Slurm requires); add the account there, or keep this user's runs off that node")
    if found.pw_uid == 0:
        return f"the user {name!r} is root (uid 0) on node {node}: the launcher never runs a rank as root"
    if found.pw_uid == rules.service_uid:
        return (f"the user {name!r} is the service account (uid {found.pw_uid}) on node {node}: ranks never run "
                "with the service's rights")
    if found.pw_uid < rules.min_uid:
        return (f"the user {name!r} is uid {found.pw_uid} on node {node}, below the launcher's floor {rules.min_uid} "
                "(system accounts): start the launcher with a lower --min-uid to allow it")
    groups = found.groups | {found.pw_gid}
    if 0 in groups:
        return (f"the user {name!r} is in group root (gid 0) on node {node}: a rank would read what that group may; "
                "take the account out of group root to let it run")
    if rules.service_gid is not None and rules.service_gid in groups:
        return (f"the user {name!r} is in the service account's group (gid {rules.service_gid}) on node {node}: "
                "a rank would read the service's group files; take the account out of that group to let it run")
    return None


def peer_allowed(peer_uid: int, rules: Rules) -> bool:
    """Only the service account's processes (its worker actors) may ask for a rank."""
    return peer_uid == rules.service_uid
