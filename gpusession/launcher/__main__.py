"""`python -m gpusession.launcher --dir DIR --service-user NAME [--min-uid 1000] [--owner-fd N]`,
run as root (by `gpusession hub`, or by a node's start command on every node of a cluster).

It makes DIR (root's, 0711) with `DIR/socket/` (root and the service account's group, 0710: only
that account may reach the socket, SO_PEERCRED checks it again on every connection) and
`DIR/scratch/` (each user's rank temporary directory, 0700, theirs), prints one JSON line
{"ready": {"socket": path, "pid": pid, "cgroups": kind}} and serves until SIGTERM, or until the
descriptor --owner-fd closes (its owner died). Every rank it started is killed when it stops.
Start it with a clean environment: it passes its own PATH and LANG to ranks, nothing else.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import socket
import sys
from pathlib import Path

from . import rootfs
from .policy import DEFAULT_MIN_UID, Rules

SOCKET_NAME = "launcher.sock"
KEPT_ENV = ("PATH", "LANG", "LC_ALL")  # all a rank gets from the launcher (drop.py adds the user's names)
ENV = "GPUSESSION_LAUNCHER"  # where the service's worker actors find the socket


def socket_path(directory: Path) -> Path:
    return directory / "socket" / SOCKET_NAME


def clean_environment(environ: dict) -> dict | None:
    """PURE: the environment to start again with, or None when it is clean already. A rank is a
    fork of this process: its /proc/self/environ shows this process's first environment whatever
    os.environ says later, so anything else there (a token a careless start passed on) would be
    every user's to read."""
    kept = {key: environ[key] for key in KEPT_ENV if key in environ}
    return None if kept == environ else kept


def main(argv: list[str] | None = None) -> int:
    clean = clean_environment(dict(os.environ))
    if clean is not None:  # exec again, the same arguments, with nothing but the kept variables
        os.execve(sys.executable, [sys.executable, "-m", "gpusession.launcher", *(argv or sys.argv[1:])], clean)
    parser = argparse.ArgumentParser(prog="python -m gpusession.launcher")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--min-uid", type=int, default=DEFAULT_MIN_UID)
    parser.add_argument("--owner-fd", type=int, default=None)
    parser.add_argument("--no-cgroups", action="store_true",
                        help="use no cgroup even where one is writable: the subreaper fallback (tests, containers)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        _say({"failed": "the launcher runs as root (it starts each rank as its user)"})
        return 2
    try:
        service = pwd.getpwnam(args.service_user)
    except KeyError:
        _say({"failed": f"the service account {args.service_user!r} does not exist on node {socket.gethostname()}"})
        return 2
    try:
        rootfs.ensure_directory(args.dir, uid=0, gid=0, mode=0o711)
        rootfs.ensure_directory(args.dir / "socket", uid=0, gid=service.pw_gid, mode=0o710)
        from .gate import Gate

        gate = Gate(args.dir, Rules(service_uid=service.pw_uid, min_uid=args.min_uid,
                                         service_gid=service.pw_gid),
                    use_cgroups=not args.no_cgroups)
    except (OSError, rootfs.UnsafePath) as exc:
        _say({"failed": str(exc)})
        return 1
    path = socket_path(args.dir)
    if path.is_socket():  # a launcher of this directory that died
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o660)
    os.chown(path, 0, service.pw_gid)
    listener.listen(64)
    if args.owner_fd is not None:
        owner = socket.socket(fileno=args.owner_fd)
    else:  # started on its own (a node's start command): it ends at SIGTERM only
        owner, _keep = socket.socketpair()
    signal.signal(signal.SIGTERM, _stop)
    from ..run.node.zygote import _serve

    _say({"ready": {"socket": str(path), "pid": os.getpid(), "cgroups": gate.tracker.kind}})
    try:
        _serve(owner, listener, gate)
    except SystemExit:
        pass
    finally:
        listener.close()
        try:
            path.unlink()
        except OSError:
            pass
    return 0


def _stop(*_) -> None:
    """SIGTERM: stop serving; a second one must not cut short the cleanup (ranks, cgroups)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def _say(message: dict) -> None:
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    sys.exit(main())
