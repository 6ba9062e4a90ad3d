"""SQLite off the broker's event loop: one writer thread that commits the books' changes in order,
and reader threads (each with its own connection; WAL lets them read while the writer writes).

A write is queued at once and committed by the writer, one transaction per change; the service
awaits `flushed()` before it replies, so a caller never hears of a change that is not on disk,
while other callers are served in the meantime. Reads first wait for the writes queued before
them, so a reader sees everything the books did until then.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from .ledger import Ledger

log = logging.getLogger("gpusession.broker")
WRITES = ("add_lease", "grant", "place", "set_notice", "close", "set_quota", "reset_quota", "set_setting")


class Journal:
    """The books' journal: the ledger's write methods, queued to the writer thread."""

    def __init__(self, ledger: Ledger, *, readers: int = 2) -> None:
        self.ledger = ledger  # used by the writer thread only from now on
        self.path = ledger.path
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-writer")
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="ledger-reader")
        self._local = threading.local()
        self._last: Future | None = None

    def __getattr__(self, name: str) -> Callable[..., Future]:
        if name not in WRITES:
            raise AttributeError(name)
        method = getattr(self.ledger, name)
        return lambda *args, **kwargs: self._submit(method, args, kwargs)

    def _submit(self, method, args, kwargs) -> Future:
        future = self._writer.submit(_logged, method, args, kwargs)
        self._last = future
        return future

    async def flushed(self) -> None:
        """Wait until every write queued so far is done. A failed write was logged by the writer
        (with the lease it names); the books stay the truth until the next restart."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait([asyncio.wrap_future(last)])

    async def read(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run a Ledger read method on a reader thread, after the writes queued before it."""
        await self.flushed()
        return await asyncio.wrap_future(self._readers.submit(self._read, name, args, kwargs))

    def _read(self, name: str, args: tuple, kwargs: dict) -> Any:
        ledger = getattr(self._local, "ledger", None)
        if ledger is None:
            ledger = self._local.ledger = Ledger(self.path, migrate=False)
        return getattr(ledger, name)(*args, **kwargs)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=False)


def _logged(method, args, kwargs):
    try:
        return method(*args, **kwargs)
    except Exception:
        log.exception("Ledger write %s%r failed; the broker's books keep the change until it restarts",
                      method.__name__, args[:1])
        raise
