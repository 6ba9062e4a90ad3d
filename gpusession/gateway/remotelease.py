"""`gs.lease()` through the gateway, on the kernel's side (`gpusession hub`): the gateway holds the
lease for this account while this kernel's connection to it lives (the protocol is in
heldlease.py). Each run on it travels as an `@gs.distributed` call does (remote.py: pickled
here, its events rendered here, its value unpickled here only); release(), or the end of this
process, gives the GPUs back. Imports no Ray."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ..run.caller import holding
from ..errors import GPUSessionError, RunCancelled
from ..observe.events import Fanout, Observer, RunInfo
from ..run.caller.interrupts import deferred_interrupts
from ..run.caller.options import RunOptions
from ..run.endings import told_when_ended
from .chunks import send_chunked
from .client import connect, gateway_path
from .frames import Connection
from .remote import GatewayGone, _follow, asking, call_fields, pickle_call
from .runwire import options_to_json
from .kinds import Kind

log = logging.getLogger("gpusession")


def hold_through_gateway(options: RunOptions, observer: Observer) -> "GatewayLease":
    """What Lease(options).acquire() does, through the gateway: the lease held for this kernel, or
    the error the local path would raise (nothing is then held)."""
    info = RunInfo()
    observer.requesting(options.lease.gpus, options.lease.workers)  # the status line, before the request travels
    path = gateway_path()
    try:
        conn, _ = connect("run", path)
    except BaseException:
        observer.released(info)  # nothing was asked for: what began with `requesting` ends
        raise
    try:
        conn.send(Kind.LEASE, options=options_to_json(options), asking=asking())
        _follow(conn, path, info, observer)
    except BaseException as exc:
        conn.close()  # the gateway releases whatever it held for this connection
        if isinstance(exc, (GatewayGone, OSError)):
            observer.released(info)  # the gateway could not say so itself
        raise
    return GatewayLease(options, observer, conn, path, info)


class GatewayLease(holding.HeldLease):
    """GPUs the gpusession gateway holds for this kernel: what `gs.lease(...)` returns under
    `gpusession hub`. Used as a local lease is: a `with` block, `run(fn, *args, **kwargs)`,
    `release()`, `gpus`, `workers`, `lease_id`, `info` (the latest run's RunInfo)."""

    def __init__(self, options: RunOptions, observer: Observer, conn: Connection, path: str, info: RunInfo) -> None:
        self.options = options
        self.observer = observer
        self.info = info
        self._conn, self._path = conn, path
        self._lock = threading.Lock()  # one request at a time on the connection
        self._release_asked = False  # a release waits for the run going on: that run's poll stops it
        self._released = False
        holding.add(self)

    # ----- what a local lease offers ------------------------------------------------------------------
    @property
    def lease_id(self) -> int | None:
        return self.info.lease_id

    @property
    def gpus(self) -> float:
        """GPUs held (an elastic lease's size as of its latest run or grant)."""
        return self.info.gpus

    @property
    def workers(self) -> int:
        return self.info.workers

    @property
    def released(self) -> bool:
        return self._released or bool(self.info.released)  # or the broker took it back (told by a run)

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run fn on every worker of this lease; returns rank 0's value (or all with return_all)."""
        with self._lock:
            if self.released:
                raise GPUSessionError(f"Lease {self.lease_id} was already released; get GPUs again with gs.lease(...).")
            with told_when_ended(self.info, self.observer):  # each run gets its receipt ("still held")
                header, buffers = pickle_call(fn, args, kwargs)
                try:
                    send_chunked(self._conn, Kind.RUN, [header, *buffers], **call_fields(fn, buffers))
                except OSError as exc:
                    self._gone()
                    raise GatewayGone(f"The gpusession gateway's connection for lease {self.lease_id} ended "
                                      f"({exc}); the gateway released its GPUs.") from None
                del header, buffers
                try:
                    return _follow(self._conn, self._path, self.info, _StoppedByRelease(self.observer, self))
                except GatewayGone:
                    self._gone()
                    raise

    def release(self, reason: str = "finished") -> None:
        """Give the GPUs back now; waits until the gateway released them (and Ray shows them free).
        A run going on in another thread is stopped first (it raises RunCancelled). Idempotent."""
        self._release_asked = True
        with deferred_interrupts(), self._lock:  # a second Ctrl-C must not cut the release in half
            if self._released:
                return
            self._released = True
            holding.discard(self)
            try:
                self._conn.send(Kind.RELEASE, reason=reason)
                _follow(self._conn, self._path, self.info, _Rendered(self.observer))
            except (GPUSessionError, OSError) as exc:
                log.warning("Lease %s: the gateway's connection ended before it said the lease was released (%s); "
                            "it releases the GPUs of a connection that ends.", self.lease_id, exc)
                self.observer.released(self.info)
            finally:
                self._conn.close()

    def _gone(self) -> None:
        self._released = True
        holding.discard(self)
        self._conn.close()


class _StoppedByRelease(Fanout):
    """A run's observer: its poll stops the run once release() was asked from another thread."""

    def __init__(self, observer: Observer, lease: GatewayLease) -> None:
        super().__init__(observer)
        self.lease = lease

    def poll(self) -> None:
        if self.lease._release_asked:
            raise RunCancelled(f"Lease {self.lease.lease_id} was released while this run went on; every worker "
                               "was stopped before its GPUs were given back.")
        super().poll()


class _Rendered(Fanout):
    """The release's observer: its events are rendered; nothing stops a release."""

    def poll(self) -> None:
        pass
