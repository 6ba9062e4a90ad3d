"""A call run through the gateway, on the kernel's side: pickle, send, render the events on the
kernel's own Observer, unpickle the result (the only place it is unpickled). Imports no Ray.

The protocol is in hosted.py. The checkpoint a run leaves stays in the gateway (in Ray's object
store, owned by the gateway process): the kernel's RunInfo.checkpoint_ref is a RemoteCheckpoint,
a handle the gateway gave this account; `info.checkpoint` fetches its bytes on demand and
`.resume()` sends the handle back. The gateway keeps each account's latest runs' checkpoints
while it runs (hosted.CHECKPOINTS_PER_USER).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import GPUSessionError
from ..observe.events import Observer, RunInfo
from .chunks import gather, send_chunked
from .client import connect, gateway_path
from .keeping import Detach
from .usergateway import detached_gateway
from .frames import Connection, Message
from .runwire import add_report, apply_info, error_from_json, options_to_json, stop_reason
from .kinds import Event, Kind

POLL_S = 0.2  # how often the kernel's observer is polled while the run goes on (its stop button)


@dataclass(frozen=True)
class RemoteCheckpoint:
    """A checkpoint the gateway holds for this account (see the module's docstring)."""

    handle: str
    path: str  # the gateway's socket

    def fetch(self) -> bytes:
        """The checkpoint's pickle (the caller unpickles it)."""
        conn, _ = connect("run", self.path)
        try:
            conn.send(Kind.CHECKPOINT, handle=self.handle)
            answer = conn.receive()
        finally:
            conn.close()
        if answer.kind != Kind.CHECKPOINT_BYTES or len(answer.payload) != 1:
            raise error_from_json(answer.get("error"))
        return answer.payload[0]


def pickle_call(fn: Callable, args: tuple, kwargs: dict) -> tuple[bytes, list]:
    """The call as bulk.py pickles it for the ranks: protocol 5, big buffers out of band (their
    memory, not copies: they are sent as raw frames)."""
    from ..run.bulk import pickle_out_of_band
    from ..run.shipping import call_arguments

    args, kwargs = call_arguments(args, kwargs)
    header, buffers = pickle_out_of_band((fn, args, kwargs))
    return header, [buffer.raw() for buffer in buffers]


def call_fields(fn: Callable, buffers: list, name: str = "") -> dict:
    """What a `run` message says of its call beside the pickle: the function's name, this
    kernel's working directory (the ranks start there), how many buffers follow the pickle."""
    return {"name": name or getattr(fn, "__name__", "function"), "cwd": os.getcwd(), "buffers": len(buffers)}


def asking() -> dict:
    """The labels of the lease request, as this kernel knows them (the sidebar's notebook and cell)."""
    from ..run.caller.kernelcell import asking_cell_id, asking_in_background, asking_notebook

    return {"notebook": asking_notebook(), "cell_id": asking_cell_id(), "background": asking_in_background()}


def run_remote(fn: Callable, args: tuple, kwargs: dict, options, *, info: RunInfo, observer: Observer,
               checkpoint_ref: Any = None, checkpoint_step: Any = None, name: str = "",
               detach: Detach | None = None, on_detached: Callable[[dict], None] | None = None) -> Any:
    """What Lease(...).acquire() + run_function() do in the local path, through the gateway: the
    value, or the error the local path would raise. observer.finished is the caller's to call.
    detach: a run the gateway hosts past this kernel, with its time limit (issue 32): the
    hub's, else this user's own (started if none runs: usergateway.py); on_detached is then told
    {run_id, max_duration, started} once the gateway took it. A resumed run goes to the gateway
    that holds its checkpoint."""
    if checkpoint_ref is not None and not isinstance(checkpoint_ref, RemoteCheckpoint):
        raise GPUSessionError("This checkpoint was made outside the gpusession gateway and cannot be resumed "
                              "through it; run from the start.")
    observer.requesting(options.lease.gpus, options.lease.workers)  # the status line, before the call travels
    try:
        if checkpoint_ref is not None:
            path = checkpoint_ref.path
        elif detach is not None:
            path = detached_gateway("submit(detach=True)", start=True)
        else:
            path = gateway_path()
        header, buffers = pickle_call(fn, args, kwargs)
        conn, _ = connect("run", path)
    except BaseException:
        observer.released(info)  # nothing was asked for: what began with `requesting` ends
        raise
    try:
        send_chunked(conn, Kind.RUN, [header, *buffers], **call_fields(fn, buffers, name),
                     options=options_to_json(options),
                     checkpoint=checkpoint_ref.handle if checkpoint_ref is not None else None,
                     checkpoint_step=checkpoint_step, asking=asking(),
                     detach=None if detach is None else detach.as_json())
        del header, buffers
        return _follow(conn, path, info, observer, on_detached)
    finally:
        conn.close()


class GatewayGone(GPUSessionError):
    """The gateway's connection ended before the run's end was told."""


def _follow(conn: Connection, path: str, info: RunInfo, observer: Observer,
            on_note: Callable[[dict], None] | None = None) -> Any:
    """Render the run's events until its end; `on_note` is told the gateway's notes about a
    detached run (the `detached` and `attached` events' fields)."""
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(conn, inbox), name="gpusession-gateway-run", daemon=True).start()
    stopped: BaseException | None = None  # what the kernel's observer raised (or a Ctrl-C): raised at the end
    handle: list = [None]
    polled = time.monotonic()
    while True:
        try:
            message = _next(inbox)
            if message is not None and message.kind != Kind.EVENT:
                break
            if message is not None and message.get("event") in (Event.DETACHED, Event.ATTACHED):
                if on_note is not None:
                    on_note(message.fields)
            elif message is not None:
                _render(message, info, observer, path, handle)
            if stopped is None and time.monotonic() - polled >= POLL_S:
                polled = time.monotonic()
                observer.poll()
        except BaseException as exc:  # noqa: BLE001 - the stop button, a cancel, a pruned trial, Ctrl-C
            if stopped is not None or isinstance(exc, GatewayGone):
                raise
            stopped = _stop(conn, exc)
    _apply(info, message.get("info") or {}, path, handle)
    if stopped is not None:
        raise stopped
    if message.kind == Kind.DONE and message.get("error") is None:
        unpickling = time.perf_counter()
        values = _values(message)
        info.returned_s += time.perf_counter() - unpickling
        return values
    raise error_from_json(message.get("error"))


def _next(inbox: queue.Queue) -> Message | None:
    try:
        message = inbox.get(timeout=POLL_S)
    except queue.Empty:
        return None
    if isinstance(message, BaseException):
        raise GatewayGone(f"The gpusession gateway's connection ended during the run ({message}); the gateway "
                          "releases its GPUs. An admin can look at the gateway's log.")
    return message


def _stop(conn: Connection, exc: BaseException) -> BaseException:
    """Ask the gateway to end the run; the error is raised once the run has ended (its GPUs released)."""
    try:
        conn.send(Kind.STOP, reason=stop_reason(exc), message=str(exc)[:1000])
    except OSError:
        raise exc from None
    return exc


def _read(conn: Connection, inbox: queue.Queue) -> None:
    while True:
        try:
            message = conn.receive()
        except Exception as exc:  # noqa: BLE001 - handed to the run's loop
            inbox.put(exc)
            return
        if message.kind == Kind.DONE:
            try:
                message = gather(conn, message)
            except Exception as exc:  # noqa: BLE001 - handed to the run's loop
                inbox.put(exc)
                return
        inbox.put(message)
        if message.kind in (Kind.DONE, Kind.FAILED):
            return


def _apply(info: RunInfo, data: dict, path: str, handle: list) -> None:
    new = apply_info(info, data)
    if new != handle[0]:
        handle[0] = new
        info.checkpoint_ref = RemoteCheckpoint(new, path) if new else None


def _render(message: Message, info: RunInfo, observer: Observer, path: str, handle: list) -> None:
    event = message.get("event")
    data = message.get("info")
    if data is not None:
        _apply(info, data, path, handle)
    if event == Event.OUTPUT:
        observer.output(message.get("rank"), message.get("stream"), message.get("text"))
    elif event == Event.REPORT:
        metrics = message.get("metrics")
        add_report(info, metrics, data or {})
        observer.report(metrics, info)
    elif event == Event.QUEUED:  # (`requesting` was the kernel's own, before it sent the call)
        observer.queued(message.get("view") or {}, message.get("elapsed_s") or 0.0)
    elif event == Event.GRANTED:
        observer.granted(info)
    elif event == Event.RUNNING:
        observer.running(info)
    elif event == Event.TRANSITION:
        observer.transition(info, message.get("line") or "")
    elif event == Event.RELEASED:
        observer.released(info)


def _values(message: Message) -> Any:
    from ..run.bulk import loads_frames

    described = message.get("values") or {}
    frames, at, values = message.payload, 0, []
    for count in described.get("items") or []:
        if count is None:
            values.append(None)
            continue
        values.append(loads_frames(frames[at], list(frames[at + 1:at + 1 + count])))
        at += 1 + count
    if described.get("all"):
        return values
    return values[0] if values else None
