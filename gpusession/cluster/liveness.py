"""Is a node there? One TCP connect to each node's raylet port, all at once, bounded. Used by the
broker (capacity, each tick) and by a run that must tell a lost host from a lost worker.

Ray declares a node dead only after its health checks fail for ~15 s (processes killed) or ~60 s
(a host gone silent); until then its GPUs look free. A connect is answered by the node's kernel,
so it says within milliseconds that a host's processes are gone (refused) and within
`timeout_s` that a host is silent (no answer), whatever load its raylet is under.
"""
from __future__ import annotations

import errno
import selectors
import socket
import time
from typing import Mapping

IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY)


def unreachable(targets: Mapping[str, tuple[str, int]], *, timeout_s: float) -> set[str]:
    """The keys of `targets` ((host, port) each) that refuse a connection or do not answer within
    timeout_s. A target with no port (0) is not probed."""
    lost: set[str] = set()
    selector = selectors.DefaultSelector()
    try:
        for key, (host, port) in targets.items():
            if not port or not host:
                continue
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            result = sock.connect_ex((host, port))
            if result == 0:
                sock.close()
            elif result in IN_PROGRESS:
                selector.register(sock, selectors.EVENT_WRITE, key)
            else:
                lost.add(key)
                sock.close()
        deadline = time.monotonic() + timeout_s
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for ready, _ in selector.select(remaining):
                if ready.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    lost.add(ready.data)
                selector.unregister(ready.fileobj)
                ready.fileobj.close()
        for pending in list(selector.get_map().values()):  # no answer in time: silent
            lost.add(pending.data)
            selector.unregister(pending.fileobj)
            pending.fileobj.close()
    finally:
        selector.close()
    return lost
