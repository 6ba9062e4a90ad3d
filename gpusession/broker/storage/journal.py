"""SQLite off the broker's event loop: one writer thread that commits the books' changes in order,
and reader threads (each with its own connection; WAL lets them read while the writer writes).

A write is queued at once and committed by the writer; the service awaits `flushed()` before it
replies, so a caller never hears of a change that is not on disk, while other callers are served
in the meantime. The writer commits what queued up while it was busy as one transaction (group
commit: 50 callers cost one commit, not 50), each change still all-or-nothing on its own (a
savepoint). Reads first wait for the writes queued before them, so a reader sees everything the
books did until then.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from .ledger import Ledger

log = logging.getLogger("gpusession.broker")
WRITES = ("add_lease", "grant", "place", "set_gpu_ids", "set_notice", "close", "resize", "set_quota", "reset_quota",
          "set_setting")
BATCHED = frozenset({"add_lease", "grant", "place", "set_gpu_ids", "set_notice", "close", "resize"})  # the hot path
MAX_BATCH = 1000


class Journal:
    """The books' journal: the ledger's write methods, queued to the writer thread."""

    def __init__(self, ledger: Ledger, *, readers: int = 2) -> None:
        self.ledger = ledger  # used by the writer thread only from now on
        self.path = ledger.path
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_forever, name="ledger-writer", daemon=True)
        self._writer.start()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="ledger-reader")
        self._local = threading.local()
        self._submitted = 0  # writes queued (the loop's thread counts them)
        self._committed = 0  # writes done (the writer's thread counts them)
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getattr__(self, name: str) -> Callable[..., Future]:
        if name not in WRITES:
            raise AttributeError(name)
        method = getattr(self.ledger, name)
        return lambda *args, **kwargs: self._submit(method, args, kwargs)

    def _submit(self, method, args, kwargs) -> Future:
        future: Future = Future()
        self._submitted += 1
        self._queue.put((method, args, kwargs, future, self._submitted))
        return future

    def _write_forever(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._write(batch)
            self._committed = batch[-1][4]
            loop = self._loop
            if loop is not None:  # one wake-up of the loop per batch, not one per write
                try:
                    loop.call_soon_threadsafe(self._wake)
                except RuntimeError:  # the loop closed (the broker is stopping)
                    pass

    def _wake(self) -> None:
        done, waiting = self._committed, []
        for seq, waiter in self._waiters:
            if seq <= done:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                waiting.append((seq, waiter))
        self._waiters = waiting

    def _write(self, batch: list) -> None:
        """Commit a batch; writes that cannot join one (upserts) commit alone, in order."""
        group: list = []
        for item in batch + [None]:
            if item is not None and item[0].__name__ in BATCHED:
                group.append(item)
                continue
            if group:
                results = []
                try:
                    with self.ledger.batch():
                        results = [_attempt(method, args, kwargs) for method, args, kwargs, *_ in group]
                except Exception as exc:  # the commit itself failed: every write of the group did
                    log.exception("Ledger commit of %d writes failed", len(group))
                    results = [(None, exc)] * len(group)
                for (_, _, _, future, _), (value, error) in zip(group, results):
                    future.set_exception(error) if error is not None else future.set_result(value)
                group = []
            if item is not None:
                method, args, kwargs, future, _ = item
                value, error = _attempt(method, args, kwargs)
                future.set_exception(error) if error is not None else future.set_result(value)

    async def flushed(self) -> None:
        """Wait until every write queued so far is done. A failed write was logged by the writer
        (with the lease it names); the books stay the truth until the next restart."""
        self._loop = asyncio.get_running_loop()
        target = self._submitted
        if self._committed >= target:
            return
        waiter = self._loop.create_future()
        self._waiters.append((target, waiter))
        if self._committed >= target:  # the writer finished before we were listed
            self._wake()
        await waiter

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
        self._queue.put(None)
        self._writer.join()
        self._readers.shutdown(wait=False)


def _attempt(method, args, kwargs) -> tuple[Any, BaseException | None]:
    try:
        return method(*args, **kwargs), None
    except Exception as exc:
        log.exception("Ledger write %s%r failed; the broker's books keep the change until it restarts",
                      method.__name__, args[:1])
        return None, exc
