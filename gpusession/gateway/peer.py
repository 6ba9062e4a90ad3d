"""Who is on the other end of a Unix socket: the uid the kernel recorded when it connected
(SO_PEERCRED), never what the caller says of itself."""
from __future__ import annotations

import pwd
import socket
import struct
from dataclasses import dataclass

UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    name: str  # the uid's passwd name; "" when the uid has none


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    return Peer(pid, uid, gid, name)
