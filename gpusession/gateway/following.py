"""A run hosted by the gateway and the kernel that follows it, on the service's side: the
kernel's stop and its death (StopWatch), the run's events sent as they happen (Forwarder), the
end told (send_done), and the placement group dropped when a kernel left a run that cannot poll
(free_when_gone); of each report sent on, the gateway keeps only its step (keep_step_only).
Used by a one-call run (hosted.py) and by the runs of a held lease
(heldlease.py), whose connection also carries the kernel's next requests."""
from __future__ import annotations

import logging
import queue
import threading
from types import MappingProxyType
from typing import Any

from ..errors import GPUSessionError
from ..observe.events import Observer, RunInfo
from .chunks import gather, send_chunked
from .frames import Connection
from .runwire import error_to_json, info_to_json, plain, stop_error
from .shelf import Shelf
from .kinds import Event, Kind

log = logging.getLogger("gpusession.gateway")
GONE_GRACE_S = 2.0  # a run polls every 0.2 s while it runs: one that has not ended by then cannot poll
REQUESTS = (Kind.RUN, Kind.RELEASE)  # what a held lease's kernel may send between runs (heldlease.py)


class StopWatch:
    """Reads what the kernel sends while its run goes on: a stop, or the end of the connection
    (or anything malformed), turns into the error the run's next poll raises.

    `requests` (a held lease's session): a `run` or `release` is put there, and the end of the
    connection too (as None); a run clears the stop left by the run before it. One request at a
    time: one sent before the last was answered (answered()) is malformed, so a kernel cannot
    pile calls up in the gateway's memory. Without `requests`, anything but a stop is malformed."""

    def __init__(self, conn: Connection, *, requests: queue.Queue | None = None) -> None:
        self.conn = conn
        self.requests = requests
        self.error: BaseException | None = None
        self.gone = False
        self.ended = threading.Event()  # the kernel is gone, or asked to stop
        self.asked = threading.Event()  # a request is being answered (a held lease's first: its lease)
        self.asked.set()
        self._thread = threading.Thread(target=self._read, name="gpusession-gateway-run-stop", daemon=True)

    def start(self) -> "StopWatch":
        self._thread.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.receive()
                request = self.requests is not None and message.kind in REQUESTS and not self.asked.is_set()
                if request and message.kind == Kind.RUN:
                    message = gather(self.conn, message)
            except Exception as exc:  # Closed, FrameError, OSError: the kernel is gone or broken
                return self._lost(KeyboardInterrupt(f"the caller's connection ended ({type(exc).__name__})"))
            if message.kind == Kind.STOP:
                if self.error is None:
                    self.error = stop_error(message.get("reason"), message.get("message"))
            elif request:
                self.asked.set()
                if message.kind == Kind.RUN and not self.gone:
                    self.error = None  # a stop sent before this run was for the run before it
                self.requests.put(message)
            else:  # anything else is malformed here: end the run, drop the kernel
                self.conn.close()
                return self._lost(KeyboardInterrupt(f"the caller sent {message.kind[:40]!r} out of turn"))

    def _lost(self, error: BaseException) -> None:
        self.gone = True
        self.error = self.error or error
        self.ended.set()
        if self.requests is not None:
            self.requests.put(None)

    def answered(self) -> None:
        """The request being answered is done (said before its answer is sent): the next may come."""
        self.asked.clear()

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class Forwarder(Observer):
    """Every event of the run, sent to the kernel as it happens (no round trip: a send each);
    poll() raises the kernel's stop. A send that fails means the kernel is gone: the run stops."""

    def __init__(self, conn: Connection, watch: StopWatch, user: str, shelf: Shelf) -> None:
        self.conn, self.watch, self.user, self.shelf = conn, watch, user, shelf
        self._ref: Any = None
        self.handle: str | None = None

    def info(self, info: RunInfo) -> dict:
        ref = info.checkpoint_ref
        if ref is not self._ref:
            self._ref = ref
            self.handle = (self.shelf.keep(self.user, ref, replacing=self.handle) if ref is not None else None)
        return info_to_json(info, checkpoint=self.handle)

    def _send(self, event: Event, **fields: Any) -> None:
        if self.watch.gone:
            return
        try:
            self.conn.send(Kind.EVENT, event=event, **fields)
        except OSError as exc:
            self.watch.gone = True
            self.watch.error = self.watch.error or KeyboardInterrupt(f"the caller's connection ended ({exc})")
            self.watch.ended.set()

    def requesting(self, gpus, workers):
        self._send(Event.REQUESTING, gpus=gpus, workers=workers)

    def queued(self, view, elapsed_s):
        self._send(Event.QUEUED, view=plain(view), elapsed_s=elapsed_s)

    def granted(self, info):
        self._send(Event.GRANTED, info=self.info(info))

    def output(self, rank, stream, text):
        self._send(Event.OUTPUT, rank=rank, stream=stream, text=text)

    def report(self, metrics, info):
        self._send(Event.REPORT, metrics=metrics, info=self.info(info))  # wire.plain_metric: JSON-safe
        keep_step_only(info.history)

    def running(self, info):
        self._send(Event.RUNNING, info=self.info(info))

    def transition(self, info, line):
        self._send(Event.TRANSITION, info=self.info(info), line=line)

    def released(self, info):
        self._send(Event.RELEASED, info=self.info(info))

    def poll(self):
        self.watch.check()


NO_STEP = MappingProxyType({})  # a report sent on that named no step: all the run path reads of it


def keep_step_only(history: list) -> None:
    """The report just sent on (the history's last) as the gateway keeps it: its step alone, all
    the run path reads of it again (a restart drops redone steps by it, a commit names it; the
    history's length counts them), so a live run's reports cost the service about 220 bytes each
    (the kernel keeps them whole), however big each was (a report may be 16 MB)."""
    if history:
        step = history[-1].get("step")
        history[-1] = {"step": step} if isinstance(step, (int, float)) else NO_STEP  # each reader judges it as before


def free_when_gone(watch: StopWatch, lease, finished: threading.Event, *, grace_s: float = GONE_GRACE_S) -> bool:
    """In a thread of its own: once the kernel is gone, give the run grace_s to end by its poll;
    a run that cannot poll then (placing its group, starting workers) loses its placement group,
    as a local run does when its kernel dies (Ray removes the dead job's groups). True: dropped."""
    watch.ended.wait()
    if not watch.gone or finished.wait(grace_s):
        return False
    log.warning("lease %s: its kernel left and the run did not end within %.0f s; its group is removed",
                getattr(lease, "lease_id", None), grace_s)
    lease.drop_group()
    return True


def result_frames(values: Any, return_all: bool) -> tuple[list, list]:
    """The run's values as they travel (still pickled by the ranks: never unpickled here): the raw
    frames, and per value its number of buffers (None: the value was None)."""
    from ..run.bulk import value_frames

    frames, items = [], []
    for value in (values if return_all else [values]):
        if value is None:
            items.append(None)
            continue
        header, buffers = value_frames(value)
        frames.append(header)
        frames.extend(buffers)
        items.append(len(buffers))
    return frames, items


def note_failure(error: BaseException | None, what: str, user: str) -> None:
    """An error the run path did not name (not a gpusession error, not a stop) goes to the log."""
    if error is not None and not isinstance(error, (GPUSessionError, KeyboardInterrupt)):
        log.warning("%s of %s failed in the gateway", what, user, exc_info=error)


def send_done(conn: Connection, forward: Forwarder, info: RunInfo, error: BaseException | None, *,
              frames: list = (), items: list | None = None, return_all: bool = False) -> None:
    """The end of a request told to the kernel: its RunInfo, its error by name, its values' frames."""
    send_chunked(conn, Kind.DONE, list(frames), info=forward.info(info),
                 error=error_to_json(error) if error is not None else None,
                 values=None if items is None else {"all": return_all, "items": items})
