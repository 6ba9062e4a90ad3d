"""What root does to the hub's files, without following a path another account can change.

The hub runs as root, and some of its paths lie where another account may write: the service
account owns `cluster/`, and Ray's temporary directory sits in /tmp. A symlink, a FIFO or a
directory of someone else's in such a place must not turn root's `chown`, `chmod` or `read` into
an act on another file (issue 28). So:
- a directory is opened without following a symlink (O_NOFOLLOW, relative to its parent's open
  descriptor), checked (a directory, owned by root or by the account it is for) and only then
  given its owner and mode, through that descriptor; its parent must be root's, and if others
  may write there, sticky (as /tmp is), so nobody can swap the directory once it is checked;
- a secret is opened the same way, without blocking (a FIFO cannot hang a login), and read only
  when it is a regular file of the expected owner, private to it, not empty and not huge.
Anything else is refused with UnsafePath, naming the path and what to do; nothing is changed.
"""
from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

SECRET_MAX_BYTES = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafePath(RuntimeError):
    """A path root was about to use is not what it should be; nothing was changed."""


def ensure_directory(path: Path, *, uid: int, gid: int, mode: int) -> None:
    """Make `path` (or find it) as a directory of uid:gid with `mode`, never following a symlink.

    An existing directory must already belong to root or to uid (a restarted hub finds its own);
    one of anybody else's, a symlink, a file or a FIFO is refused."""
    parent_fd = os.open(path.parent, _DIR_FLAGS)
    try:
        _check_parent(path.parent, os.fstat(parent_fd))
        try:
            os.mkdir(path.name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(path.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file, a FIFO, a socket
            raise UnsafePath(f"{path} is {_what(path)}, not a directory: gpusession hub will not use it. "
                             "Remove it (and check who put it there), then start the hub again.") from exc
        try:
            found = os.fstat(fd)
            if found.st_uid not in (0, uid):
                raise UnsafePath(f"{path} belongs to {_name(found.st_uid)}, not to {_name(uid)} or root: gpusession "
                                 "hub will not use it. Remove it (and check who made it), then start the hub again.")
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def read_secret(path: Path, *, owner: int | None) -> str:
    """The stripped text of a secret file, opened without blocking; refused unless it is a regular
    file with text in it. With `owner` (a uid): its last two components are not followed as
    symlinks, and the file must belong to that account and be readable by it alone. Without
    (a Kubernetes secret volume, whose files are symlinks root's kubelet made): symlinks followed."""
    fd = _open_secret(path, nofollow=owner is not None)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise UnsafePath(f"{path} is {_kind(found.st_mode)}, not a regular file: the secret cannot be read. "
                             "Remove it; the broker makes a new one at its next start.")
        if owner is not None and found.st_uid != owner:
            raise UnsafePath(f"{path} belongs to {_name(found.st_uid)}, not to {_name(owner)}: it is not the "
                             "service's secret. Remove it; the broker makes a new one at its next start.")
        if owner is not None and found.st_mode & 0o077:
            raise UnsafePath(f"{path} is readable by others (mode {stat.S_IMODE(found.st_mode):o}): its secret may "
                             "be known. Remove it; the broker makes a new one at its next start.")
        if not 0 < found.st_size <= SECRET_MAX_BYTES:
            raise UnsafePath(f"{path} holds {found.st_size} bytes (a secret has 1 to {SECRET_MAX_BYTES}). "
                             "Remove it; the broker makes a new one at its next start.")
        text = os.read(fd, SECRET_MAX_BYTES + 1).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text:
        raise UnsafePath(f"{path} holds only blanks. Remove it; the broker makes a new one at its next start.")
    return text


def uid_of(account: str) -> int:
    """The uid of an account; UnsafePath when it does not exist."""
    try:
        return pwd.getpwnam(account).pw_uid
    except KeyError:
        raise UnsafePath(f"The account {account!r} does not exist on this machine.") from None


def _open_secret(path: Path, *, nofollow: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        if not nofollow:
            return os.open(path, flags)
        parent_fd = os.open(path.parent, _DIR_FLAGS | os.O_NOFOLLOW)
        try:
            return os.open(path.name, flags, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
    except FileNotFoundError:
        raise UnsafePath(f"{path} does not exist: the broker makes it at its first start. Is the hub's "
                         "cluster service running?") from None
    except OSError as exc:
        raise UnsafePath(f"{path} cannot be opened as a secret ({exc.strerror}; {_what(path)}). "
                         "Remove it; the broker makes a new one at its next start.") from exc


def _check_parent(parent: Path, found: os.stat_result) -> None:
    """PURE over the parent's stat: root's, and sticky if others may write there."""
    if found.st_uid != 0:
        raise UnsafePath(f"{parent} belongs to {_name(found.st_uid)}, not root: whoever owns it could swap what "
                         "gpusession hub makes there. Choose a --state-dir in a folder only root can change.")
    if found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{parent} may be changed by other accounts (mode {stat.S_IMODE(found.st_mode):o}, not "
                         "sticky): choose a --state-dir in a folder only root can change.")


def _what(path: Path) -> str:
    try:
        return _kind(os.lstat(path).st_mode)
    except OSError:
        return "missing"


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"))
    return next((name for test, name in kinds if test(mode)), "a device or other special file")


def _name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
