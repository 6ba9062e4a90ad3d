"""The run session, on the service's side: a kernel's call run by the one run path (Lease,
controller, recovery, streaming) inside the gateway process, for the account the kernel runs as.

The messages (JSON header + raw frames, frames.py; after the hello of session "run"):

    kernel -> gateway, first message, one of
      run         {name, cwd, options, buffers, checkpoint, checkpoint_step, asking, frames,
                   detach: null | {max_duration}}
                  payload: [pickle of (fn, args, kwargs), *its out-of-band buffers]
      more        payload: the next frames of the message before it (chunks.py: a message
                  carries at most 64 frames; `frames` says how many it has in all)
      checkpoint  {handle}          the bytes of a checkpoint this account's run left (shelf.py)
      list        {every_user?}     this account's detached runs -> runs {runs: [row, ...]} (row: run_id, name,
                                    user, state, gpus, workers, started, ended, end_reason, max_duration,
                                    notebook, expires, reports); every_user: true, every account's, for an
                                    admin of the gateway only (`gpusession runs list --every-user`)
      attach      {run_id}          follow a detached run of this account: event {event: "attached",
                                    run: row}, the events so far, the live ones, then done
                                    (a stop on this connection stops the run)
      cancel      {run_id}          stop a detached run (its owner, or an admin) -> cancelling {run_id}
      lease       {options, asking} hold GPUs for several runs (gs.lease): the rest of the session
                                    is heldlease.py's
    kernel -> gateway, while a run goes on
      stop        {reason: "interrupted" | "cancelled", message}: end it as the local path would
    gateway -> kernel
      event       {event: "detached", run_id, max_duration, started}   first, for a detached run
      event       {event, ...}      one Observer event: requesting {gpus, workers}, queued {view,
                                    elapsed_s}, granted/running/released {info}, output {rank,
                                    stream, text}, report {metrics, info}, transition {info, line}
      done        {info, error, values, frames} payload (then `more`): each value's pickle and
                                    buffers, in order;
                                    values: {"all": bool, "items": [null | buffer count]}
      checkpoint_bytes {}           payload: [the checkpoint's pickle]
      failed      {error}           a request refused before any run (bad message, unknown handle, an
                                    account's live detached runs at detached.LIVE_RUNS_PER_USER)

The gateway never unpickles what a kernel sent: the call's bytes go into Ray's object store as
they came (bulk.shipment_of) and a rank unpickles them; a result leaves as the rank pickled it.
The connection closing (the kernel died), a malformed message or a stop makes the run's poll
raise: the run ends as interrupted and its GPUs are released (poll runs every 0.2 s while the
run runs, every second while it queues); a run that cannot poll then (placing its group, starting
workers) loses its placement group after GONE_GRACE_S, as Ray removes a dead local kernel's.

A detached run (issue 32; detached.py, keeping.py) is not stopped by its connection closing: the
gateway hosts it until its function ends, a stop or cancel, or its max_duration (then RunTimeout;
a run that cannot poll then loses its group GONE_GRACE_S later). Its events and end are kept for
any kernel of the same account that attaches, for the admin's retention after it ended, in memory.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from typing import Any

from ..errors import GPUSessionError, QuotaExceeded
from ..observe.events import Fanout, RunInfo
from ..run.endings import EndReason
from . import keeping
from .acting import Acting, identity_of
from .activity import FOLLOWING
from .detached import FLUSH_S, REGISTRY, HostedRun, Registry, value_size
from .chunks import gather
from .intake import CALL_BYTES, CallBytes, Intake, Share
from .following import (GONE_GRACE_S, Forwarder, StopWatch, free_when_gone, note_failure, result_frames,
                        send_done)
from .frames import Connection, Message
from .peer import Peer
from .heldlease import serve_lease
from .runrequest import RunRequest, run_request
from .runwire import BadRunMessage, error_to_json, stop_error
from .server import Caller
from .shelf import SHELF, Shelf
from .kinds import Event, Kind

log = logging.getLogger("gpusession.gateway")


# ----- detached runs' stops and limit -----------------------------------------------------------------
class DetachedForwarder(Forwarder):
    """A detached run's events go to its record (kept, sent to whoever follows); its poll raises a
    stop or cancel from any following kernel, or RunTimeout at its max_duration."""

    def __init__(self, hosted: HostedRun, user: str, shelf: Shelf) -> None:
        super().__init__(None, None, user, shelf)
        self.hosted = hosted

    def _send(self, event: Event, **fields: Any) -> None:
        self.hosted.publish({"event": event, **fields})

    def poll(self):
        self.hosted.check(time.time())


def read_stops(conn: Connection, hosted: HostedRun, peer: Peer) -> None:
    """A kernel following a detached run: its stop stops the run; its leaving (or anything
    malformed) only stops it following. While it follows the live run, the run is its activity."""
    with FOLLOWING.live(peer, going=lambda: hosted.ended_at is None):
        try:
            while True:
                message = conn.receive()
                if message.kind != Kind.STOP:
                    break
                hosted.request_stop(stop_error(message.get("reason"), message.get("message")))
        except Exception:  # noqa: BLE001 - Closed, FrameError, OSError: the kernel left
            pass
        finally:
            hosted.unfollow(conn)


def drop_when_stuck(hosted: HostedRun, lease, finished: threading.Event, *, grace_s: float = GONE_GRACE_S) -> bool:
    """A detached run asked to stop (or past its time limit) that has not ended grace_s later
    (it cannot poll while placing its group or starting workers) loses its placement group."""
    while not hosted.stopping.wait(max(0.0, hosted.started_at + hosted.max_duration_s - time.time())):
        if keeping.over_time(hosted.started_at, hosted.max_duration_s, time.time()):
            break
    if finished.wait(grace_s):
        return False
    log.warning("detached run %s: stopped and not ended within %.0f s; its group is removed", hosted.run_id, grace_s)
    lease.drop_group()
    return True


# ----- the session ------------------------------------------------------------------------------------
def serve_run(conn: Connection, caller: Caller, hello: Message, keys: Acting, *,
              shelf: Shelf = SHELF, registry: Registry = REGISTRY, call_bytes: CallBytes = CALL_BYTES) -> None:
    """The handler of the gateway's "run" session (see the module's docstring)."""
    intake = call_bytes.intake(caller.user)
    conn.admit = intake.admit  # a call's bytes count against its account's limit as they come (intake.py)
    try:
        _serve(conn, caller, keys, shelf, registry, intake)
    finally:
        intake.close()


def _serve(conn: Connection, caller: Caller, keys: Acting, shelf: Shelf, registry: Registry, intake: Intake) -> None:
    first = conn.receive()
    if first.kind == Kind.RUN:
        first = gather(conn, first)
        refusal = intake.refusal()
        if refusal is not None:
            del first
            log.warning("a call of %s refused: %s", caller.user, refusal)
            conn.send(Kind.FAILED, error=error_to_json(refusal))
            return
    if first.kind == Kind.CHECKPOINT:
        return _send_checkpoint(conn, caller, first, shelf)
    if first.kind in (Kind.LIST, Kind.ATTACH, Kind.CANCEL):
        return _serve_detached(conn, caller, first, registry)
    if first.kind == Kind.LEASE:
        return serve_lease(conn, caller, first, keys, shelf, intake)
    if first.kind != Kind.RUN:
        conn.send(Kind.FAILED, error={"type": "InvalidRequest",
                                   "message": f"a run session begins with run, lease or checkpoint, not {first.kind[:40]!r}"})
        return
    try:
        request = run_request(first, registry.policy.default_max_duration_s)
    except BadRunMessage as exc:
        conn.send(Kind.FAILED, error={"type": "InvalidRequest", "message": f"The gateway refused the call: {exc}."})
        return
    share = intake.share(first.payload)  # given back as the arrays are shipped, the rest at the session's end
    del first  # the call's bytes live on in request (and in the object store once shipped)
    _run(conn, caller, request, keys, shelf, registry, share)


def _run(conn: Connection, caller: Caller, request: RunRequest, keys: Acting, shelf: Shelf,
         registry: Registry, share: Share) -> None:
    hosted = None
    if request.detach is not None:
        try:
            hosted = registry.add(caller.user, request.name, request.options.lease.gpus,
                                  request.options.lease.workers, request.detach, request.asking.get("notebook"))
        except QuotaExceeded as exc:  # the account's live runs are at the registry's limit
            log.warning("detached run %s of %s refused: %s", request.name, caller.user, exc)
            try:
                conn.send(Kind.FAILED, error=error_to_json(exc))
            except OSError:
                pass  # the kernel left already
            return
    try:
        _host(conn, caller, request, keys, shelf, hosted, share)
    finally:
        if hosted is not None and hosted.ended_at is None:  # the gateway failed: the record ends all the same
            log.error("detached run %s of %s: the gateway failed hosting it", hosted.run_id, caller.user)
            hosted.finish({"info": {}, "values": None, "error": {
                "type": "GPUSessionError", "message": "The gpusession gateway failed hosting this run; an admin "
                                                      "can look at its log."}}, [], EndReason.FAILED)


def _host(conn: Connection, caller: Caller, request: RunRequest, keys: Acting, shelf: Shelf,
          hosted: HostedRun | None, share: Share) -> None:
    from ..run.caller.lease import Lease
    from ..run.caller.kernelcell import mark_background
    from ..run.bulk import shipment_of
    from ..run.caller.controller import CallerPlace, run_function
    from ..run.endings import end_reason
    from ..run.caller.stepreport import StepToBroker

    identity = identity_of(caller, keys)
    if hosted is not None:
        try:
            conn.send(Kind.EVENT, event=Event.DETACHED, run_id=hosted.run_id, max_duration=hosted.max_duration_s,
                      started=hosted.started_at)
        except OSError:
            pass  # the kernel left already: the run goes on (gs.runs(all=True) lists it)
        origin = hosted.follow(conn)
        threading.Thread(target=read_stops, args=(conn, hosted, caller.peer), daemon=True,
                         name="gpusession-gateway-detached-stop").start()
        watch = StopWatch(conn)  # never started: the connection's end does not end a detached run
        forward = DetachedForwarder(hosted, caller.user, shelf)
    else:
        watch = StopWatch(conn).start()
        forward = Forwarder(conn, watch, caller.user, shelf)
    observer = Fanout(forward, StepToBroker(identity))
    info = RunInfo()
    checkpoint_ref = shelf.get(caller.user, request.checkpoint) if request.checkpoint else None
    values, error = None, None
    finished = threading.Event()
    if request.asking.get("background"):
        mark_background()
    following = ExitStack()  # the kernel's run is its activity until it ends (a detached one: read_stops)
    if hosted is None:
        following.enter_context(FOLLOWING.live(caller.peer, going=lambda: not watch.gone))
    try:
        if request.checkpoint and checkpoint_ref is None:
            raise GPUSessionError(
                f"{request.name}.resume(): the gateway no longer holds that checkpoint (it keeps the last "
                f"{shelf.per_user} runs' checkpoints of each account while it runs). Run from the start.")
        shipped = []
        lease = Lease(request.options, observer=observer, info=info, identity=identity, asking=request.asking)
        if hosted is None:
            threading.Thread(target=free_when_gone, args=(watch, lease, finished), daemon=True,
                             name="gpusession-gateway-run-gone").start()
        else:
            threading.Thread(target=drop_when_stuck, args=(hosted, lease, finished), daemon=True,
                             name="gpusession-gateway-detached-limit").start()
        with lease.acquire(before_request=lambda: shipped.append(shipment_of(request.header, request.buffers))):
            shipped_bytes = sum(len(buffer) for buffer in request.buffers)
            request.buffers.clear()  # the object store holds them now
            share.shipped(shipped_bytes)
            values = run_function(lease, None, (), {}, info=info, observer=observer,
                                  checkpoint_ref=checkpoint_ref, checkpoint_step=request.checkpoint_step,
                                  shipment=shipped[0], raw_results=True,
                                  caller=CallerPlace(caller.user, request.cwd))
    except BaseException as exc:  # noqa: BLE001 - told to the kernel as text, never re-raised here
        error = exc
    finally:
        finished.set()
        watch.ended.set()  # the watchdog's thread ends with the run
        following.close()
    info.end_reason = end_reason(error)
    note_failure(error, f"run {request.name}", caller.user)
    if hosted is None and watch.gone:
        log.info("run %s of %s ended (%s) after its kernel left", request.name, caller.user, info.end_reason)
        return
    frames, items = result_frames(values, request.options.return_all) if error is None else ([], None)
    if hosted is not None:
        refusal = keeping.result_refusal(value_size(frames))
        if refusal is not None:
            frames, items, error = [], None, keeping.ResultTooLarge(refusal)
        hosted.finish({"info": forward.info(info), "error": error_to_json(error) if error is not None else None,
                       "values": None if items is None else {"all": request.options.return_all, "items": items}},
                      frames, info.end_reason)
        origin.join(FLUSH_S)  # the end sent to the kernel that started it (if it is still there)
        return
    send_done(conn, forward, info, error, frames=frames, items=items, return_all=request.options.return_all)


def _send_checkpoint(conn: Connection, caller: Caller, message: Message, shelf: Shelf) -> None:
    ref = shelf.get(caller.user, message.get("handle"))
    if ref is None:
        conn.send(Kind.FAILED, error={"type": "GPUSessionError", "message": (
            "The gateway no longer holds that checkpoint (it keeps the last "
            f"{shelf.per_user} runs' checkpoints of each account while it runs).")})
        return
    import ray

    data = ray.get(ref).data  # CheckpointData: its pickle as a numpy array over the object store
    conn.send(Kind.CHECKPOINT_BYTES, [memoryview(data)])


# ----- detached runs: list, attach, cancel ----------------------------------------------------------
def _not_kept(run_id: Any, user: str, retention_s: float) -> dict:
    return {"type": "GPUSessionError", "message": (
        f"The gateway keeps no detached run {str(run_id)[:40]!r} of {user}: gs.runs(all=True) lists yours. "
        f"Ended runs are kept {retention_s / 86400:g} days, and none survives a restart of the gateway.")}


def _every_user_refusal(every_user: Any, caller: Caller) -> dict | None:
    """Why a list asking for every account's runs is refused (None: it is not)."""
    if not isinstance(every_user, bool):
        return {"type": "InvalidRequest", "message": "The gateway refused the request: every_user must be true or "
                                                     f"false; got {type(every_user).__name__}."}
    if every_user and not caller.admin:
        return {"type": "NotAuthorized", "message": (
            f"Only an admin of the gateway lists every account's detached runs, and {caller.user} is not one "
            "(the hub's admins are named by `gpusession hub --admin`); `gpusession runs list` shows your own.")}
    return None


def _serve_detached(conn: Connection, caller: Caller, message: Message, registry: Registry) -> None:
    if message.kind == Kind.LIST:
        every_user = message.get("every_user", False)
        refusal = _every_user_refusal(every_user, caller)
        if refusal is not None:
            conn.send(Kind.FAILED, error=refusal)
            return
        conn.send(Kind.RUNS, runs=registry.rows(None if every_user else caller.user))
        return
    try:
        run_id = keeping.run_id_of(message.get("run_id"))
    except BadRunMessage as exc:
        conn.send(Kind.FAILED, error={"type": "InvalidRequest", "message": f"The gateway refused the request: {exc}."})
        return
    hosted = registry.get(run_id)
    if message.kind == Kind.CANCEL:
        if hosted is None or not keeping.may_cancel(hosted.user, caller.user, caller.admin):
            conn.send(Kind.FAILED, error=_not_kept(run_id, caller.user, registry.policy.retention_s))
            return
        from ..errors import RunCancelled

        by = "its owner" if hosted.user == caller.user else f"the admin {caller.user}"
        hosted.request_stop(RunCancelled(
            f"The detached run {run_id} ({hosted.name}) was cancelled by {by}; every worker was stopped and its "
            "GPUs released."))
        log.info("detached run %s of %s: cancel asked by %s", run_id, hosted.user, caller.user)
        conn.send(Kind.CANCELLING, run_id=run_id, ended=hosted.ended_at is not None)
        return
    if hosted is None or not keeping.may_see(hosted.user, caller.user):
        conn.send(Kind.FAILED, error=_not_kept(run_id, caller.user, registry.policy.retention_s))
        return
    conn.send(Kind.EVENT, event=Event.ATTACHED, run=hosted.row())
    follower = hosted.follow(conn)
    if hosted.ended_at is not None:
        follower.join(FLUSH_S)  # the records so far and the end, sent before the session closes
        return
    read_stops(conn, hosted, caller.peer)  # until the kernel leaves (after the end, or before)
