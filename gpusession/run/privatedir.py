"""A directory of this account's own inside a folder every account may write (/dev/shm, /tmp).

A fixed name there can be taken: another account that makes `/dev/shm/<name>` first (mode 0777,
its own) controls every entry under it, and reads, swaps or links what this account then writes
there. So the directory is made 0700 if missing and, made or found, checked without following a
link: a directory, this account's, and nobody else's to enter. Anything else is refused, naming
the path, its owner and mode, and what to do; nothing found is ever changed (no chmod, no chown).
Once checked it cannot be swapped: its parent must be sticky (or this account's or root's and
closed to others), so nobody else may rename or remove it. Pure I/O: no Ray.
"""
from __future__ import annotations

import os
import pwd
import stat

from ..errors import GPUSessionError


class NotPrivate(GPUSessionError, PermissionError):
    """A directory gpusession keeps this account's files in is not this account's alone."""


def private_dir(parent: str, name: str, *, holds: str = "files") -> str:
    """`parent/name`, a 0700 directory of this account (made now if missing). `holds` says in
    the refusal what gpusession keeps there."""
    path = os.path.join(parent, name)
    _check_parent(parent, path, holds)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(path)
    me = os.geteuid()
    if stat.S_ISLNK(found.st_mode):
        raise NotPrivate(f"{path} is a symbolic link (to {_target(path)}), not a directory, made by "
                         f"{_account(found.st_uid)}: gpusession keeps this account's ({_account(me)}) {holds} "
                         "there and will not follow it. An admin removes the link (and checks who made it).")
    if not stat.S_ISDIR(found.st_mode):
        raise NotPrivate(f"{path} is not a directory (owner {_account(found.st_uid)}, mode "
                         f"{stat.filemode(found.st_mode)}): gpusession keeps this account's ({_account(me)}) "
                         f"{holds} there. An admin removes it (and checks who made it).")
    if found.st_uid != me:
        raise NotPrivate(f"another account made {path} (owner {_account(found.st_uid)}, mode "
                         f"{_mode(found)}); gpusession keeps this account's ({_account(me)}) {holds} there and "
                         "will not use it: an admin removes it (and checks who made it), and gpusession makes "
                         "it again, private.")
    if found.st_mode & 0o077:
        raise NotPrivate(f"{path} is this account's ({_account(me)}) but mode {_mode(found)}: other accounts may "
                         f"enter it, and gpusession keeps this account's {holds} there only when they cannot. "
                         f"Remove it (gpusession makes it again, 0700) or `chmod 700 {path}`.")
    return path


def _check_parent(parent: str, path: str, holds: str) -> None:
    """Nobody but this account (or root) may rename what lies in `parent`: sticky when others may
    write it, and owned by this account or root (an owner may always change its own folder)."""
    found = os.stat(parent)
    me = os.geteuid()
    shared = found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX
    if found.st_uid not in (0, me) or shared:
        raise NotPrivate(f"{parent} (owner {_account(found.st_uid)}, mode {_mode(found)}) lets another account "
                         f"rename or replace {path}: gpusession keeps this account's ({_account(me)}) {holds} "
                         "only under a folder of its own or root's, sticky if others may write it (as /tmp "
                         "and /dev/shm are). Set TMPDIR to such a folder.")


def _mode(found: os.stat_result) -> str:
    return f"{stat.S_IMODE(found.st_mode):04o}"


def _account(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
