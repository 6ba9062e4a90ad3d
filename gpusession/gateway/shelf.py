"""The checkpoints hosted runs left, kept by the gateway for their kernels (gateway/remote.py's
RemoteCheckpoint is the kernel's side)."""
from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from typing import Any

CHECKPOINTS_PER_USER = 16  # runs whose last checkpoint an account can still fetch or resume from


class Shelf:
    """The checkpoints runs left, per account: an ObjectRef the gateway owns (so the object stays
    in the store) under a random handle that only its account can use. A run keeps one entry (its
    latest commit); an account keeps its CHECKPOINTS_PER_USER latest runs' entries."""

    def __init__(self, per_user: int = CHECKPOINTS_PER_USER) -> None:
        self.per_user = per_user
        self._by_user: dict[str, OrderedDict[str, Any]] = {}
        self._lock = threading.Lock()

    def keep(self, user: str, ref: Any, *, replacing: str | None = None) -> str:
        handle = uuid.uuid4().hex
        with self._lock:
            kept = self._by_user.setdefault(user, OrderedDict())
            if replacing is not None:
                kept.pop(replacing, None)
            kept[handle] = ref
            while len(kept) > self.per_user:
                kept.popitem(last=False)
        return handle

    def get(self, user: str, handle: Any) -> Any:
        with self._lock:
            kept = self._by_user.get(user, {})
            ref = kept.get(handle) if isinstance(handle, str) else None
            if ref is not None:
                kept.move_to_end(handle)
            return ref


SHELF = Shelf()
