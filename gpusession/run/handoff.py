"""The files a rank needs from its worker actor, handed over as open descriptors (SCM_RIGHTS)
on the rank's channel before its first message: the node's copy of the call's big buffers
(read-only) and the file for its result's big buffers (made empty by the actor, writable).

Under `gpusession hub` the rank runs as its user and the actor as the service account, whose
/dev/shm folder (0700) the rank cannot open, and must not: a descriptor gives it exactly these
two files, and no other user's. One byte says which of the two follow (bit 0: buffers, bit 1:
result), so the same code serves every setup.
"""
from __future__ import annotations

import os
import socket

HAS_BULK, HAS_RESULT = 1, 2


def send(channel_fd: int, bulk_fd: int | None, result_fd: int | None) -> None:
    fds = [fd for fd in (bulk_fd, result_fd) if fd is not None]
    flags = (HAS_BULK if bulk_fd is not None else 0) | (HAS_RESULT if result_fd is not None else 0)
    sock = socket.socket(fileno=os.dup(channel_fd))
    try:
        socket.send_fds(sock, [bytes([flags])], fds)
    finally:
        sock.close()


def receive(channel_fd: int) -> tuple[int | None, int | None]:
    """In the rank: (buffers' descriptor, result's descriptor), each None when not sent."""
    sock = socket.socket(fileno=os.dup(channel_fd))
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1, 2)
    finally:
        sock.close()
    if not data:
        raise EOFError("the worker actor closed the rank's channel before its files")
    flags, fds = data[0], list(fds)
    bulk_fd = fds.pop(0) if flags & HAS_BULK and fds else None
    result_fd = fds.pop(0) if flags & HAS_RESULT and fds else None
    return bulk_fd, result_fd
