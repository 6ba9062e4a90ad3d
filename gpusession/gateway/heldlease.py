"""A held lease through the gateway (`gs.lease` under `gpusession hub`), on the service's side:
the gateway leases GPUs for the account the kernel runs as (SO_PEERCRED, never what the kernel
says) and holds them while the kernel's connection lives. Each run on them is hosted as a
one-call run is (hosted.py): the run path's Lease.run, the call's bytes never unpickled, its
values relayed as the ranks pickled them.

The messages, in a run session (after the hello of session "run"; hosted.py has the others):

    kernel -> gateway
      lease    {options, asking}      first: lease now -> events (queued, granted, released), then
                                      done {info, error}: held (error null), or nothing is and the
                                      session ends
      run      {name, cwd, buffers, frames}  payload: [the call's pickle, *its buffers] (then
                                      `more`): a run on the held lease -> events, done as a run's
                                      (a malformed one -> failed {error}; the lease stays held)
      stop     {reason, message}      while the lease is asked for or a run goes on: end that
      release  {reason}               give the GPUs back -> events, done {info}; the session ends
    One request at a time: a run or release sent before the last request was answered (or
    anything else) ends the connection, and with it the lease.

Nothing names the lease: only this connection reaches it, so no other account (nor another
kernel of the same account) can run on it or release it. The connection's end (the kernel died)
stops a run going on and releases the lease ("caller gone"); a run that cannot poll then loses
its placement group following.GONE_GRACE_S later, as a one-call run does.
"""
from __future__ import annotations

import logging
import queue
import threading

from ..observe.events import Fanout, RunInfo
from .acting import Acting, identity_of
from .activity import FOLLOWING
from .following import Forwarder, StopWatch, free_when_gone, note_failure, result_frames, send_done
from .frames import Connection, Message
from .runrequest import call_of, lease_request
from .intake import Intake
from .runwire import BadRunMessage, error_to_json
from .server import Caller
from .shelf import Shelf
from .kinds import Kind

log = logging.getLogger("gpusession.gateway")
GONE = "caller gone"  # the release reason when the kernel's connection ended (as the broker's own)


def serve_lease(conn: Connection, caller: Caller, first: Message, keys: Acting, shelf: Shelf,
                intake: Intake) -> None:
    """The `lease` request of a run session, and everything after it on that connection (each
    run's bytes counted by `intake`, the connection's share of its account's limit)."""
    try:
        request = lease_request(first)
    except BadRunMessage as exc:
        conn.send(Kind.FAILED, error={"type": "InvalidRequest", "message": f"The gateway refused the lease: {exc}."})
        return
    from ..run.caller.lease import Lease
    from ..run.caller.stepreport import StepToBroker

    identity = identity_of(caller, keys)
    requests: queue.Queue = queue.Queue()
    watch = StopWatch(conn, requests=requests).start()
    forward = Forwarder(conn, watch, caller.user, shelf)
    lease = Lease(request.options, observer=Fanout(forward, StepToBroker(identity)), info=RunInfo(),
                  identity=identity, asking=request.asking)
    releasing = threading.Event()
    threading.Thread(target=free_when_gone, args=(watch, lease, releasing), daemon=True,
                     name="gpusession-gateway-lease-gone").start()
    try:
        lease.acquire()
    except BaseException as exc:  # noqa: BLE001 - told to the kernel; acquire released what it held
        releasing.set()
        watch.ended.set()
        note_failure(exc, "a lease", caller.user)
        _tell(conn, watch, forward, lease, exc)
        return
    reason = GONE
    try:
        reason = _hold(conn, caller, lease, requests, forward, watch, intake)
    finally:
        releasing.set()
        lease.release(reason)
        watch.ended.set()  # free_when_gone's thread ends with the session
    log.info("lease %s of %s released (%s)", lease.lease_id, caller.user, reason)
    _tell(conn, watch, forward, lease, None)


def _hold(conn: Connection, caller: Caller, lease, requests: queue.Queue, forward: Forwarder,
          watch: StopWatch, intake: Intake) -> str:
    """The lease is held: tell the kernel, then run what it asks until it releases the lease or
    leaves. The release's reason."""
    from ..run.caller.idle_resize import resize_while_idle

    resize_while_idle(lease)  # an elastic lease gives GPUs up (and takes them back) between runs
    log.info("lease %s of %s: %g GPUs held for its kernel", lease.lease_id, caller.user, lease.gpus)
    _tell(conn, watch, forward, lease, None)
    while (message := requests.get()) is not None and message.kind == Kind.RUN:
        with FOLLOWING.live(caller.peer, going=lambda: not watch.gone):  # a run on it is its kernel's activity
            _run_on(conn, caller, lease, message, forward, watch, intake)
    return GONE if message is None else _reason(message.get("reason"))


def _run_on(conn: Connection, caller: Caller, lease, message: Message, forward: Forwarder,
            watch: StopWatch, intake: Intake) -> None:
    from ..run.bulk import shipment_of
    from ..run.caller.controller import CallerPlace

    refusal = intake.refusal()
    if refusal is not None:  # over the account's bytes of calls: refused, the lease stays held
        message.payload.clear()
        log.warning("a run on lease %s of %s refused: %s", lease.lease_id, caller.user, refusal)
        watch.answered()
        conn.send(Kind.FAILED, error=error_to_json(refusal))
        return
    with intake.share(message.payload) as share:
        try:
            call = call_of(message)
        except BadRunMessage as exc:
            watch.answered()
            conn.send(Kind.FAILED, error={"type": "InvalidRequest", "message": f"The gateway refused the run: {exc}."})
            return
        message.payload.clear()  # the call's bytes live on in `call` alone (and in the object store once shipped)
        values, error = None, None
        try:
            shipment = shipment_of(call.header, call.buffers)
            shipped_bytes = sum(len(buffer) for buffer in call.buffers)
            call.buffers.clear()  # the object store holds them now
            share.shipped(shipped_bytes)
            values = lease.run_call(None, (), {}, shipment=shipment, raw_results=True,
                                    caller=CallerPlace(caller.user, call.cwd))
        except BaseException as exc:  # noqa: BLE001 - told to the kernel as text, never re-raised here
            error = exc
    note_failure(error, f"run {call.name} on lease {lease.lease_id}", caller.user)
    if watch.gone:
        log.info("run %s on lease %s of %s ended after its kernel left", call.name, lease.lease_id, caller.user)
        return
    frames, items = result_frames(values, lease.options.return_all) if error is None else ([], None)
    watch.answered()
    send_done(conn, forward, lease.info, error, frames=frames, items=items, return_all=lease.options.return_all)


def _tell(conn: Connection, watch: StopWatch, forward: Forwarder, lease, error: BaseException | None) -> None:
    """The end of the lease request or of the release, told unless the kernel is gone."""
    if watch.gone:
        return
    watch.answered()
    try:
        send_done(conn, forward, lease.info, error)
    except OSError:
        pass  # the kernel left meanwhile: what it asked for is done all the same


def _reason(value) -> str:
    """The release reason the kernel gave, if the broker would take it; else 'released'."""
    from ..broker.protocol.request import release_reason

    try:
        return release_reason(value)
    except ValueError:
        return "released"
