"""An attempt's rendezvous store is served by a fork of the node's warm parent (run/store.py;
real processes, no Ray): a peer can use it, it lives as long as its pipe is open and ends when
the pipe closes, and an address it cannot bind comes back as the reason, not a hang."""
from __future__ import annotations

from datetime import timedelta

import psutil
from torch.distributed import TCPStore

from gpusession.run import messages as m
from gpusession.run import handoff, wire
from gpusession.run.node.zygote import Zygote

START_S = 180.0  # the warm parent imports torch; a loaded 2-core machine is slow
STORE_TIMEOUT_S = 3.0  # the store's own: how long it tries an address before it gives up
ANSWER_S = 30.0 + STORE_TIMEOUT_S


def _serve(zygote: Zygote, address: str) -> tuple[int, object, m.StoreServing]:
    pid, pipe = zygote.fork()
    handoff.send(pipe.fileno(), None, None)  # no files: as the worker actor starts a store
    pipe.send(m.ServeStore(address, 2, STORE_TIMEOUT_S))
    assert pipe.poll(ANSWER_S), f"the store process did not answer within {ANSWER_S:.0f} s"
    return pid, pipe, wire.decode(pipe.recv_bytes(), pipe.recv_bytes)  # as the worker actor reads it


def test_a_fork_of_the_warm_parent_serves_the_store_until_its_pipe_closes():
    zygote = Zygote.start()
    try:
        zygote.wait_ready(START_S)
        pid, pipe, answer = _serve(zygote, "127.0.0.1")
        assert answer.error == "" and answer.port > 0
        assert psutil.Process(pid).ppid() == zygote.pid  # a fork of the warm parent: torch already imported
        peer = TCPStore("127.0.0.1", answer.port, 2, is_master=False, timeout=timedelta(seconds=10))
        peer.set("key", "value")
        assert peer.get("key") == b"value"
        assert zygote.exit_status(pid, 0.5) is None  # still serving while the pipe is open
        pipe.close()  # the actor's next attempt, or the actor gone
        assert zygote.exit_status(pid, ANSWER_S) == (0, None)
    finally:
        zygote.close()


def test_an_address_the_store_cannot_bind_is_answered_as_the_reason():
    zygote = Zygote.start()
    try:
        zygote.wait_ready(START_S)
        pid, pipe, answer = _serve(zygote, "192.0.2.1")  # TEST-NET-1: never this machine's
        assert answer.port == 0 and "192.0.2.1" in answer.error, answer
        assert zygote.exit_status(pid, ANSWER_S) == (0, None)
        pipe.close()
    finally:
        zygote.close()
