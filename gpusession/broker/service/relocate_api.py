"""The broker's methods for a run that lost a host and restarts at its size on other hosts.

A mixin of BrokerService (service.py), like ResizeMethods. `relocate`: the lease's workers on
the lost hosts move to GPUs free now elsewhere (relocation.py decides where, or why not); from
the reply on the books hold those GPUs for the lease, so no other request takes them while its
caller re-makes its group there. `relocated`: the re-made group is where it was told to go, on
these GPU ids. Anything else is refused and changes nothing. The hosts a caller reports lost lend
nothing until a reading of Ray made after the report (the broker probes every node each tick)
says they answer.
"""
from __future__ import annotations

import logging
import time

from ...errors import InvalidRequest
from ..policy import policy, relocation
from ..protocol import request as checks
from .door import door
from .rayview import Snapshot
from ..policy.states import LeaseState

log = logging.getLogger("gpusession.broker")


class RelocateMethods:
    @door
    async def relocate(self, lease_id: int, lost_nodes: list, *, auth: dict) -> dict:
        """Move the workers the lease had on `lost_nodes` to free GPUs on other nodes, at once
        and all of them, or none: {"moved": True, ...the lease's view, node_workers: where its
        workers go now} or {"moved": False, "why": "the hosts that remain have ..."}."""
        row = await self._owned(lease_id, auth, "move")
        _check_movable(row)
        held = dict(row.get("node_workers") or {})
        lost = checks.node_ids(lost_nodes, "lost_nodes", most=max(1, len(held)))
        strangers = [node for node in lost if node not in held]
        if strangers:
            raise InvalidRequest(f"lost_nodes names node {strangers[0][:16]}..., where lease {row['id']} has no "
                                 f"workers (it has them on {len(held)} node(s): {', '.join(n[:12] for n in held)}). "
                                 "Nothing was changed.")
        # No await from the decision to the books' change: no other request can take these GPUs first.
        nodes = self.snapshot.with_lost(lost).nodes_for(self.books.active())
        answer = relocation.relocate(held, set(lost), free_by_node=policy.free_gpus(nodes, self.books.active()),
                                     total_by_node={node.node_id: node.gpus for node in nodes},
                                     gpus_per_worker=row["gpus_per_worker"], placement=row["placement"])
        if answer.node_workers is None:
            log.info("Lease %d of %s lost node(s) %s and cannot move: %s", row["id"], row["user"],
                     ", ".join(n[:12] for n in lost), answer.why)
            return {**self._view_of(row, time.time()), "moved": False, "why": answer.why}
        now = time.time()
        self.reported_lost.update({node: now for node in lost})
        self.snapshot = self.snapshot.with_lost(lost)
        self._apply(self.books.resize(row["id"], row["workers"], answer.node_workers, now))
        self._apply(self.books.record_gpu_ids(row["id"], {}))  # its group is re-made: ids unknown until told
        self.vanished.pop(row["id"], None)  # the group is removed and made again under the same name
        log.info("Lease %d of %s lost node(s) %s: its workers move to %s", row["id"], row["user"],
                 ", ".join(n[:12] for n in lost), {n[:12]: w for n, w in answer.node_workers.items()})
        self._schedule()
        await self._committed()
        return {**self._view_of(await self._row(row["id"]), time.time()), "moved": True}

    @door
    async def relocated(self, lease_id: int, node_workers: dict, *, gpu_ids: dict, auth: dict) -> dict:
        """The lease's re-made group is placed where `relocate` moved it (`node_workers`, exactly),
        with these GPU ids (checked as `placed` checks them)."""
        row = await self._owned(lease_id, auth, "report the placement of")
        if row["state"] != LeaseState.PLACED.value:
            raise InvalidRequest(f"Lease {row['id']} is {row['state']}, not placed: only a placed lease is moved. "
                                 "Nothing was changed.")
        counts = checks.node_workers(node_workers, workers=row["workers"])
        if counts != row.get("node_workers"):
            raise InvalidRequest(f"node_workers {counts} is not where lease {row['id']} was moved "
                                 f"({row.get('node_workers')}): report the placement relocate gave. "
                                 "Nothing was changed.")
        parsed = await self._check_gpu_ids(row, counts, gpu_ids)
        self._apply(self.books.record_gpu_ids(row["id"], parsed))
        self.vanished.pop(row["id"], None)
        await self._committed()
        return self._view_of(await self._row(row["id"]), time.time())

    def _keep_reported_lost(self, snapshot: Snapshot, reading_began: float) -> Snapshot:
        """A node reported lost while this reading was under way stays lost in it; one reported
        before the reading began is as the reading found it."""
        self.reported_lost = {node: at for node, at in self.reported_lost.items() if at >= reading_began}
        return snapshot.with_lost(self.reported_lost)


def _check_movable(row: dict) -> None:
    if row["state"] != LeaseState.PLACED.value:
        raise InvalidRequest(f"Lease {row['id']} is {row['state']}, not placed: only a placed lease moves off a "
                             "lost host. Nothing was changed.")
    kind = (row.get("notice") or {}).get("kind")
    if kind:
        raise InvalidRequest(f"Lease {row['id']} is under a {kind} notice: it cannot move off a lost host. "
                             "Nothing was changed.")
