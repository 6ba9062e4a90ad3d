"""The workers and hosts an attempt lost, told apart from the echoes of their loss.

A rank's worker is reported lost two ways: its heartbeat connection closes or goes silent
(heartbeat.py, within moments), or Ray reports its actor dead (seconds later). One lost host
ends several ranks, and the processes of a dying host do not all go at once: the first loss is
held for a moment (LOSS_GATHER_S) so the host's other ranks report theirs, and a worker lost
while its host still answers is asked about again after HOST_SETTLE_S before it counts as one
worker's loss. What was lost reaches the follower as a Fault with its WorkerFailed (through
`fail`); whom to blame is judgements.blame, a pure function."""
from __future__ import annotations

import logging
import time
from typing import Callable

from ...cluster.raycluster import node_answers
from ...errors import WorkerFailed
from . import judgements as judge
from ..heartbeat import BeatMonitor, Loss
from ..policies import Fault, FaultKind, ranks_text

LOSS_GATHER_S = 0.15  # after a first lost heartbeat, how long the host's other ranks have to report theirs
NODE_ANSWER_TIMEOUT_S = 0.3  # is the host of a lost worker still there? (its raylet's port)
# A worker lost while its host still answers is judged after this: the processes of a host that
# dies do not all go at once (seen under load: a worker gone, its raylet still answering), so the
# host is asked again before the loss is called one worker's.
HOST_SETTLE_S = 1.0


class Losses:
    def __init__(self, lease, ranks: list, *, silence_s: float | None,
                 fail: Callable[[Fault, WorkerFailed], None]) -> None:
        self.lease = lease  # its size, for the messages
        self.rank_nodes = {spec.rank: spec.address for spec, _, _ in ranks}
        self.rank_node_ids = {spec.rank: spec.node_id for spec, _, _ in ranks}
        self.rank_workers = {spec.rank: worker for spec, _, worker in ranks}
        self.beats = _monitor(self.rank_workers, silence_s) if silence_s else None
        self._fail = fail
        self.pending: dict[int, Loss] = {}
        self.lost_nodes: dict[str, str] = {}  # Ray node id -> "host (ip, Ray node id)" of hosts lost
        self.lost_ranks: set[int] = set()  # ranks whose worker actor died
        self.suspects: dict[str, tuple[float, list[Loss]]] = {}  # node -> (since, losses) while its host answers
        self.exited: set[int] = set()  # ranks whose process ended after its result or error

    def close(self) -> None:
        if self.beats is not None:
            self.beats.close()

    def where(self, rank: int, host: str) -> str:
        address = self.rank_nodes.get(rank) or ""
        if host and address:
            return f"{host} ({address})"
        return host or address or "?"

    def lost(self, rank: int, exc: Exception) -> None:
        """Ray reports the rank's worker actor dead: the same judgement as a lost heartbeat."""
        if rank in self.lost_ranks:  # its host was already judged lost
            return
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        how = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        if rank in self.pending:  # its heartbeat said it first, and says it better
            how = self.pending.pop(rank).how
        self._blame(self.rank_node_ids.get(rank, ""), [Loss(rank, how, time.time())])

    def check_heartbeats(self, *, wait: bool = False) -> None:
        """Judge the lost heartbeats once LOSS_GATHER_S has passed since the first (wait: the
        attempt is over, so wait for that now)."""
        if self.beats is None:
            return
        for loss in self.beats.take_losses():
            if loss.key not in self.exited and loss.key not in self.lost_ranks:  # a rank that ended lost nothing
                self.pending[loss.key] = loss
        if not self.pending:
            return
        first = min(loss.at for loss in self.pending.values())
        if wait:
            time.sleep(max(0.0, first + LOSS_GATHER_S - time.time()))
        elif not judge.losses_gathered(first, time.time(), LOSS_GATHER_S):
            return  # the other ranks of that host report theirs within moments
        losses, self.pending = self.pending, {}
        by_node: dict[str, list[Loss]] = {}
        for rank, loss in sorted(losses.items()):
            if rank in self.lost_ranks:  # judged meanwhile, when Ray reported its worker dead
                continue
            by_node.setdefault(self.rank_node_ids.get(rank, ""), []).append(loss)
        for node_id, node_losses in by_node.items():
            self._blame(node_id, node_losses)

    def settle_suspects(self, *, wait: bool = False) -> None:
        """Judge the workers lost while their host answered, once HOST_SETTLE_S has passed (wait:
        the attempt is over, so wait for that now)."""
        for node_id, (since, losses) in list(self.suspects.items()):
            left = since + HOST_SETTLE_S - time.monotonic()
            if left > 0 and not wait:
                continue
            time.sleep(max(0.0, left))
            del self.suspects[node_id]
            self._blame(node_id, losses, settled=True)

    def _blame(self, node_id: str, losses: list[Loss], *, settled: bool = False) -> None:
        how = losses[0].how
        answers = bool(node_id) and node_answers(node_id, NODE_ANSWER_TIMEOUT_S)
        whom = judge.blame(node_known=bool(node_id), host_answers=answers, settled=settled)
        if whom is judge.Blame.HOST:
            self.suspects.pop(node_id, None)
            ranks = tuple(sorted(r for r, n in self.rank_node_ids.items() if n == node_id))
            host = self._host_name(ranks[0], node_id)
            self.lost_ranks.update(ranks)
            self.lost_nodes[node_id] = host
            fault = Fault(FaultKind.HOST_LOST, ranks[0], self._host_name(ranks[0], node_id[:12]), how, ranks=ranks)
            self._fail(fault, WorkerFailed(
                f"Host {host} was lost ({how}) with {ranks_text(ranks)}. The ranks on the other hosts were "
                f"stopped and every GPU of the lease released.",
                rank=ranks[0], node=self.where(ranks[0], ""), remote_type="HostLost", remote_message=how,
            ))
            return
        if whom is judge.Blame.SUSPECT:  # the host answers, for now: ask it again in a moment
            since, earlier = self.suspects.get(node_id, (time.monotonic(), []))
            self.suspects[node_id] = (since, earlier + losses)
            self.lost_ranks.update(loss.key for loss in losses)
            return
        for loss in losses:  # the host still answers: only these workers went (an actor killed)
            rank = loss.key
            self.lost_ranks.add(rank)
            where = self.where(rank, self._worker_host(rank))
            self._fail(Fault(FaultKind.WORKER_LOST, rank, where, loss.how), WorkerFailed(
                f"The worker of rank {rank} on {where} was lost ({loss.how}). Every worker was stopped and the "
                f"{self.lease.gpus:g} GPUs released.",
                rank=rank, node=where, remote_type="WorkerLost", remote_message=loss.how,
            ))

    def _worker_host(self, rank: int) -> str:
        worker = self.rank_workers.get(rank)
        return (getattr(worker, "info", None) or {}).get("host", "")

    def _host_name(self, rank: int, node_id: str) -> str:
        name, address = self._worker_host(rank), self.rank_nodes.get(rank, "")
        return f"{name or '?'} ({address}, Ray node {node_id})"


def _monitor(rank_workers: dict, silence_s: float) -> BeatMonitor | None:
    targets = {}
    for rank, worker in rank_workers.items():
        info = getattr(worker, "info", None) or {}
        if info.get("beat_port"):
            targets[rank] = (info["address"], info["beat_port"], info.get("beat_token", ""))
    if not targets:
        return None
    monitor = BeatMonitor(targets, silence_s)
    if monitor.unwatched:
        logging.getLogger("gpusession").warning(
            "No heartbeat from the workers of ranks %s (%s): a lost host is noticed only when Ray declares it "
            "dead. Let the caller reach the worker nodes on every TCP port (docs/admin/clusters.md, 'What must be "
            "reachable between the hosts').",
            sorted(monitor.unwatched), "; ".join(sorted(set(monitor.unwatched.values()))))
    return monitor
