"""The broker's node probe on real sockets: a listening port answers, a closed one is lost at
once, an address nothing answers from is lost within the bound."""
from __future__ import annotations

import socket
import time

from gpusession.broker.policy import messages
from gpusession.cluster import liveness


def test_a_listening_node_answers_and_a_closed_port_is_lost_at_once():
    alive = socket.socket()
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    started = time.monotonic()
    lost = liveness.unreachable({"up": ("127.0.0.1", alive.getsockname()[1]), "down": ("127.0.0.1", closed_port),
                                 "unknown": ("127.0.0.1", 0)}, timeout_s=1.0)
    assert lost == {"down"} and time.monotonic() - started < 0.5
    alive.close()


def test_an_address_that_never_answers_is_lost_within_the_bound():
    """A host gone silent drops our SYN; so does Linux for a port whose accept queue is full."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    fillers = []
    for _ in range(4):  # fill the accept queue (nobody accepts): further SYNs get no answer
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(silent.getsockname())
        fillers.append(filler)
    time.sleep(0.05)
    started = time.monotonic()
    assert liveness.unreachable({"silent": silent.getsockname()}, timeout_s=0.3) == {"silent"}
    took = time.monotonic() - started
    assert 0.25 < took < 0.3 + 0.7, (f"declared unreachable {took:.2f} s after the probe began: expected at its "
                                     "0.3 s bound (not at once, as a refusal would be), with 0.7 s margin for load")
    for sock in fillers + [silent]:
        sock.close()


def test_an_unplaced_grant_blames_outside_use_only_when_ray_shows_it():
    lost = {"nodes": [{"node_id": "ab" * 28, "lost": True, "address": "10.0.0.7"}], "gpus_unmanaged": 0.0}
    assert "node abababababab (10.0.0.7) was lost" in messages.not_placed(4, 30, lost)
    outside = {"nodes": [{"node_id": "ab" * 28, "lost": False}], "gpus_unmanaged": 2.0}
    assert "something outside gpusession is using 2 GPUs" in messages.not_placed(4, 30, outside)
    neither = messages.not_placed(4, 30, {"nodes": [], "gpus_unmanaged": 0.0})
    assert "something outside" not in neither and "no node was lost" in neither


def test_a_node_whose_host_started_ray_again_on_the_same_ports_is_lost_though_the_port_answers():
    from gpusession.broker.service.rayview import Snapshot, replaced
    from gpusession.broker.policy.model import NodeCapacity
    from gpusession.cluster.raycluster import NodeInfo

    old, new, other = (NodeInfo("old", "10.0.0.12", 2.0, False, True, 52369),
                       NodeInfo("new", "10.0.0.12", 2.0, False, True, 52369),
                       NodeInfo("other", "10.0.0.11", 2.0, False, True, 52369))
    assert replaced([old, new, other], {"old": 1.0, "new": 5.0, "other": 1.0}) == {"old"}
    assert replaced([old, other], {"old": 1.0, "other": 1.0}) == set()
    assert replaced([old, new], {"old": 1.0, "new": 1.0}) == set()  # seen together first: no telling which
    # a node reported lost lends nothing there, whatever a reading said
    snapshot = Snapshot([NodeCapacity("old", 2.0), NodeCapacity("other", 2.0)], True, addresses={"old": "10.0.0.12"})
    assert snapshot.with_lost(["old"]).lost == {"old": "10.0.0.12"}
    assert snapshot.with_lost(["old"]).nodes_for([]) == [NodeCapacity("old", 2.0, 2.0), NodeCapacity("other", 2.0)]


def test_the_nodes_whose_scratch_the_broker_sweeps_are_those_that_joined_or_came_back():
    from gpusession.broker.service.rayview import Snapshot, joined

    def reading(seen: list[str], lost: tuple[str, ...] = ()) -> Snapshot:
        return Snapshot([], True, lost={n: "10.0.0.9" for n in lost}, first_seen={n: 1.0 for n in seen})

    assert joined(reading(["a"]), reading(["a", "b"])) == ["b"]  # a host started again: a new node
    assert joined(reading(["a"]), reading(["a", "b"], lost=("b",))) == []  # not while it does not answer
    assert joined(reading(["a", "b"], lost=("b",)), reading(["a", "b"])) == ["b"]  # its link back
    assert joined(reading(["a", "b"]), reading(["a", "b"])) == []  # nothing new: nothing to sweep
