"""The broker's method for elastic leases: a lease changes size as its notice asked.

A mixin of BrokerService (service.py), like AdminMethods: the same books, journal and checks.
The notices themselves (shrink, and offers to grow) are made by the books when they schedule
(books.py, elastic.py); this is where the lease's holder answers them.
"""
from __future__ import annotations

import time

from ...errors import InvalidRequest
from ..protocol import request as checks
from .door import door
from ..protocol.notice import NoticeKind
from ..policy.states import LeaseState


class ResizeMethods:
    @door
    async def resize(self, lease_id: int, workers: int, node_workers: dict | None = None, *,
                     gpu_ids: dict | None = None, auth: dict) -> dict:
        """An elastic lease changes size: it shrank as a shrink notice asked (node_workers: where
        its workers are now), it takes an offer to grow (node_workers None: the broker holds the
        GPUs for it from now on), it says where its regrown group landed (no notice, same size), or
        it shrank by itself (no notice: a host under it was lost), never below min_gpus. Anything
        else is refused and changes nothing."""
        row = await self._owned(lease_id, auth, "resize")
        if row["state"] != LeaseState.PLACED.value:
            raise InvalidRequest(f"Lease {row['id']} is {row['state']}, not placed: only a placed lease changes "
                                 "size. Nothing was changed.")
        top = row.get("full_workers") or row["workers"]
        workers = checks.whole(workers, "workers", low=row.get("min_workers") or row["workers"], high=top)
        self._check_resize(row, workers, node_workers)
        if node_workers is not None:
            node_workers = checks.node_workers(node_workers, workers=workers)
            known = {node.node_id for node in self.snapshot.nodes}
            strangers = sorted(set(node_workers) - known)
            if known and strangers:
                raise InvalidRequest(f"node_workers names node {strangers[0][:16]}..., which has no GPUs in this "
                                     "cluster. Nothing was changed.")
        if gpu_ids is not None:  # checked as placed() checks them, at the new size
            if node_workers is None:
                raise InvalidRequest("gpu_ids must come with node_workers (the workers per node they belong to). "
                                     "Nothing was changed.")
            gpu_ids = await self._check_gpu_ids({**row, "workers": workers}, node_workers, gpu_ids)
        self._apply(self.books.resize(row["id"], workers, node_workers, time.time()))
        if node_workers is not None:  # a re-made group: its old GPU ids no longer hold (unknown if not told)
            self._apply(self.books.record_gpu_ids(row["id"], gpu_ids or {}))
        self.vanished.pop(row["id"], None)  # its group was re-made under the same name
        self._schedule()
        await self.journal.flushed()
        return self._view_of(await self._row(row["id"]), time.time())

    @staticmethod
    def _check_resize(row: dict, workers: int, node_workers) -> None:
        notice = row.get("notice") or {}
        kind = NoticeKind(notice["kind"]) if notice.get("kind") else None
        lease = f"Lease {row['id']}"
        if kind is NoticeKind.SHRINK:
            if workers > notice["to_workers"] or node_workers is None:
                raise InvalidRequest(f"{lease} was asked to shrink to {notice['to_workers']} workers: report at "
                                     f"most that many, with node_workers. Nothing was changed.")
        elif kind is NoticeKind.GROW:
            if workers != notice["to_workers"] or node_workers is not None:
                raise InvalidRequest(f"{lease} was offered {notice['to_workers']} workers: take exactly that "
                                     "many, without node_workers. Nothing was changed.")
        elif kind:
            raise InvalidRequest(f"{lease} is under a {kind.value} notice: it cannot change size. Nothing was changed.")
        elif workers > row["workers"] or node_workers is None:
            # Giving GPUs back unasked is always allowed (an elastic run that lost a host goes on
            # with the workers that remain); growing needs an offer.
            raise InvalidRequest(f"{lease} holds {row['workers']} workers and has no offer to grow: it may "
                                 "shrink (down to its min_gpus) or report where its workers are, with node_workers. "
                                 "Nothing was changed.")
