"""An attempt's rendezvous store, served by a fork of the node's warm parent (zygote.py).

The store must outlive the attempt's rank processes (a peer may still wait on its last answer
when rank 0 exits), so rank 0's worker actor keeps it until the next attempt. It used to live in
the actor itself, which then had to import torch.distributed: ~3 s of CPU in every worker actor
(any may become a rank 0), paid on a cold node beside the warm parent's own import of torch
(benchmarks/spread_first.py). A fork of the warm parent has it imported already: the actor asks
for one as it asks for a rank process, and holds its pipe; the store process ends when that pipe
closes (the actor's next attempt, or the actor gone: the warm parent then kills it too).
"""
from __future__ import annotations

from datetime import timedelta
from multiprocessing.connection import Connection

from . import messages as m
from . import wire


def serve(conn: Connection, request: m.ServeStore) -> None:
    """In the forked process: bind the store on a port the OS picks (no gap in which another
    process could take a port found free), answer it, and serve until the pipe closes."""
    try:
        from torch.distributed import TCPStore

        store = TCPStore(request.address, 0, request.world_size, is_master=True,
                         timeout=timedelta(seconds=request.timeout_s), wait_for_workers=False)
    except Exception as exc:  # the actor raises it where the caller sees it
        conn.send_bytes(wire.encode(m.StoreServing(error=f"{type(exc).__name__}: {exc}"))[0])
        return
    conn.send_bytes(wire.encode(m.StoreServing(port=store.port))[0])
    try:
        while True:
            conn.recv()  # nothing is sent: this returns at EOF, when the actor closes its end
    except (EOFError, OSError):
        pass
