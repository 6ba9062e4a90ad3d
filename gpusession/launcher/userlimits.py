"""The limits a rank starts with (as root, in the launcher and in the child it forks): the user's
own from /etc/security (limits.py decides, as pam_limits would for a login), made concrete
against the launcher's limits, which the child inherits, and set before the child drops to the
user, as a login sets them before its shell becomes the user's.
"""
from __future__ import annotations

import ctypes
import grp
import os
import resource
from dataclasses import dataclass
from pathlib import Path

from .limits import NOFILE, UNLIMITED, UserLimits, Who, limits_files_in_order, user_limits, with_current
from .policy import Account

SECURITY = Path("/etc/security")
PR_SET_NO_NEW_PRIVS = 38


class Unusable(RuntimeError):
    """The user's limits cannot be read or set: their rank is refused, as pam_limits refuses the login."""


@dataclass(frozen=True)
class Settings:
    """What the child sets, still root: (resource, soft, hard) with -1 for no limit, as setrlimit takes it."""

    rlimits: tuple[tuple[int, int, int], ...] = ()
    priority: int | None = None
    no_new_privs: bool = False


def for_account(account: Account, *, security: Path = SECURITY) -> tuple[Settings, UserLimits]:
    """The settings of a rank of `account` on this node (raises Unusable with the reason)."""
    nr_open = _nr_open()
    found = user_limits(_read(security), _who(account), nr_open=nr_open)
    if found.no_login:
        raise Unusable(f"{found.no_login} gives {account.pw_name!r} maxlogins 0 (no login at all), "
                       "so no rank runs as them either; change that entry to let them run")
    if found.exempt:
        return Settings(), found
    rlimits = []
    for limit in found.rlimits:
        soft, hard = with_current(limit, tuple(_from_kernel(v) for v in resource.getrlimit(limit.resource)))
        if limit.resource == NOFILE and hard > nr_open:
            raise Unusable(f"{account.pw_name!r}'s nofile limit {hard} is above the kernel's fs.nr_open "
                           f"({nr_open}): lower it in {security}/limits.conf or limits.d")
        rlimits.append((limit.resource, _to_kernel(soft), _to_kernel(hard)))
    return Settings(tuple(rlimits), found.priority, found.no_new_privs), found


def apply(settings: Settings) -> None:
    """In the forked child, as root, before it drops to the user."""
    for number, soft, hard in settings.rlimits:
        resource.setrlimit(number, (soft, hard))
    if settings.priority is not None:
        os.setpriority(os.PRIO_PROCESS, 0, settings.priority)
    if settings.no_new_privs:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _read(security: Path) -> list[tuple[str, str]]:
    main = security / "limits.conf"
    folder = security / "limits.d"
    try:
        names = [str(path) for path in folder.glob("*.conf")] if folder.is_dir() else []
    except OSError as exc:
        raise Unusable(f"cannot list {folder}: {exc}") from exc
    files = []
    for path in limits_files_in_order(str(main) if main.exists() else None, names):
        try:
            files.append((path, Path(path).read_text(errors="replace")))
        except FileNotFoundError:
            continue  # removed between the listing and now
        except OSError as exc:
            raise Unusable(f"cannot read {path}: {exc}") from exc
    return files


def _who(account: Account) -> Who:
    ids = account.groups | {account.pw_gid}
    names = set()
    for gid in ids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    return Who(account.pw_name, account.pw_uid, account.pw_gid, ids, frozenset(names))


def _nr_open() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 1024 * 1024  # the kernel's default


def _from_kernel(value: int) -> int:
    return UNLIMITED if value == resource.RLIM_INFINITY or value < 0 else value


def _to_kernel(value: int) -> int:
    return resource.RLIM_INFINITY if value >= UNLIMITED else value
