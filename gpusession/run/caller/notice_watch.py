"""The broker's watch on one lease: a call parked in the broker that returns when the lease gets
a notice (preempt, revoke, shrink, an offer to grow) or ends, its answer parsed once into a
Notice.

The lease starts it once its group is placed. A run's follower waits on `ref` beside its ranks'
streams (an idle held lease's watcher, run/caller/idle_resize.py, on its own); after a resize, or an
offer to grow that lapsed, `rearm` watches for the next notice, past the one just handled."""
from __future__ import annotations

import ray

from ...broker import client
from ...broker.protocol.notice import Notice
from ...identity import Identity


class NoticeWatch:
    def __init__(self, lease_id: int, identity: Identity | None = None) -> None:
        self.lease_id, self.identity = lease_id, identity
        self.notice: Notice | None = None
        self.ref = self._watch(seen=None)

    def _watch(self, *, seen: str | None):
        return client.broker().watch.remote(self.lease_id, auth=client.lease_auth(self.identity), seen=seen)

    def take(self, *, wait: bool = False) -> Notice | None:
        """The notice, if one arrived (wait: until one does)."""
        while self.notice is None:
            ready, _ = ray.wait([self.ref], timeout=None if wait else 0)
            if not ready:
                break
            try:
                view = ray.get(self.ref)
            except ray.exceptions.RayActorError:  # the broker was replaced: watch through the new one
                client.forget()
                self.ref = self._watch(seen=None)
                continue
            self.notice = Notice.from_view(view)
        return self.notice

    def rearm(self) -> None:
        """Watch for the next notice: the broker answers at once with any other than this one."""
        seen = self.notice.id if self.notice is not None else None
        self.notice = None
        self.ref = self._watch(seen=seen)
