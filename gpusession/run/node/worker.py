"""The worker actor: the caller's hand on one node, relaying for one rank at a time.

The actor never runs user code. For each rank of each attempt it asks its zygote (the node's
warm parent: torch imported, CUDA untouched) for a fresh process, sends it the rank's Launch,
and relays what the rank sends as items of a Ray streaming generator. So the actor itself can
serve every call of its kernel, on real GPUs too, while each rank starts with nothing a previous
call changed. Rank 0's actor also keeps the attempt's rendezvous store, which must outlive the
rank processes (a peer may still be waiting on its last answer when rank 0 exits): a fork of
the warm parent too (store.py), so the actor itself never imports torch.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import socket
import threading
import time
from typing import NamedTuple

import ray

from .. import bulk
from .. import handoff
from .. import messages as m
from .. import wire
from ..bulk import Shipment
from ...cluster.placement import PlacementState
from ...errors import LaunchRefused
from .zygote import Zygote
from . import scratch
from ..heartbeat import BeatServer
from ..privatedir import NotPrivate
from ..spec import RankSpec, lease_scratch_dir, scratch_dir, scratch_root  # noqa: F401  (RankSpec: imported from here by callers)

ZYGOTE_START_TIMEOUT_S = 120.0  # a loaded node may take a while to import torch
EXIT_STATUS_WAIT_S = 2.0
STORE_ANSWER_MARGIN_S = 30.0  # beyond the store's own timeout (its bind takes milliseconds; it then checks itself)
WATCHDOG_POLL_S = 1.0
NODE_HOST_NAMESPACE = "gpusession"  # the Ray namespace of the node hosts (nodehost.py), which this worker asks
LAUNCHER_ENV = "GPUSESSION_LAUNCHER"  # set by `gpusession hub`: the root launcher's socket (gpusession/launcher/)


def launcher_path() -> str | None:
    """The node's launcher socket when ranks run as their users (under the hub), else None: the
    actor's own warm parent forks them as its own account, as in every one-user setup."""
    return os.environ.get(LAUNCHER_ENV) or None


class _RankProcess(NamedTuple):
    zygote: Zygote  # its warm parent: the only one that may kill it by pid
    pid: int
    run_id: str  # its attempt


class Worker:
    def __init__(self, zygote_path: str | None = None, host_name: str | None = None) -> None:
        # The node host's warm parent (nodehost.py) when started by it, else one of our own (a
        # call with its own runtime_env), which starts importing torch now, in parallel.
        self._zygote_path, self._host_name = zygote_path, host_name
        self._launcher = launcher_path()  # then every child is started as its caller's account
        self.zygote = self._new_zygote()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.address = ray.util.get_node_ip_address()
        self.cluster = ray.get_runtime_context().get_session_name()  # keys this cluster's scratch
        self._store: tuple[Zygote, int, object] | None = None  # rank 0's actor: the attempt's store process and its pipe
        self._run_lock = threading.Lock()  # one rank at a time
        self._child: _RankProcess | None = None  # the rank process now running, if any
        self._stopped_runs: collections.deque = collections.deque(maxlen=64)  # attempts told to stop
        self._conn = None
        self._conn_run: str | None = None  # the attempt of the rank at the other end of _conn
        self._conn_lock = threading.Lock()
        self._beats = BeatServer(self.address)  # the controller's heartbeat (run/heartbeat.py)
        _sweep_stale_scratch()

    def info(self) -> dict:
        self.zygote.wait_ready(ZYGOTE_START_TIMEOUT_S)
        return {"node_id": self.node_id, "address": self.address, "pid": os.getpid(),
                "host": socket.gethostname(), "zygote_pid": self.zygote.pid, "beat_port": self._beats.port,
                "beat_token": self._beats.token}

    def open_rendezvous(self, world_size: int, timeout_s: float, account: str = "") -> tuple[str, int]:
        """Rank 0's actor: the attempt's TCPStore, served until the next attempt by a fork of the
        warm parent (store.py), which binds a port the OS picks and answers it. Under the hub it
        runs as the caller's `account`, as the ranks do; LaunchRefused (the launcher would not
        start that account here) fails the call before any rank starts."""
        self._close_store()  # the last attempt's: its ranks are gone by now
        self.zygote.wait_ready(ZYGOTE_START_TIMEOUT_S)
        pid, conn = self._fork(account, role="store")
        zygote = self.zygote
        self._store = (zygote, pid, conn)
        try:
            handoff.send(conn.fileno(), None, None)
            conn.send(m.ServeStore(self.address, world_size, timeout_s))
            waited = timeout_s + STORE_ANSWER_MARGIN_S
            answer = wire.decode(conn.recv_bytes(), conn.recv_bytes) if conn.poll(waited) else m.StoreServing(
                error=f"the store process did not answer within {waited:.0f} s")
        except (EOFError, OSError):
            answer = m.StoreServing(error="the store process exited before it answered")
        except wire.WireError as exc:
            answer = m.StoreServing(error=f"the store process answered with something else: {exc}")
        if answer.error:
            self._close_store()
            raise RuntimeError(f"Could not serve the rendezvous store on {self.address}: {answer.error}")
        return self.address, answer.port

    def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is None:
            return
        zygote, pid, conn = store
        conn.close()  # the store process exits at EOF; the kill makes sure, the wait reaps its status
        zygote.kill(pid)
        zygote.exit_status(pid, EXIT_STATUS_WAIT_S)

    def cleanup(self, lease_id: int) -> None:
        """The lease ended: remove its scratch directories on this node (a backstop: each
        attempt's directory goes when its last rank here ends)."""
        scratch.remove_lease(lease_scratch_dir(self.cluster, lease_id))
        bulk.remove_lease(self.cluster, lease_id)

    def stop(self, run_id: str | None = None) -> None:
        """Kill the rank process of this attempt (any, without run_id) and everything it started,
        now; a rank of that attempt whose launch is still queued behind this call never starts."""
        if run_id is not None:
            self._stopped_runs.append(run_id)
        child = self._child
        if child is not None and run_id in (None, child.run_id):  # never a later attempt's rank
            child.zygote.kill(child.pid)

    def request_checkpoint(self, reason: str, wanted: bool = True) -> None:
        """Make gs.should_checkpoint() true (or false again) in the current rank process."""
        self._send(m.ShouldCheckpoint(reason, wanted))

    def checkpoint_kept(self, run_id: str) -> None:
        """The caller holds its copy of the checkpoint that the rank of attempt `run_id` just
        committed: that rank's gs.save_checkpoint returns (a later attempt's rank hears nothing)."""
        self._send(m.CheckpointAck(), run_id=run_id)

    def shutdown(self) -> None:
        self.stop()
        self._close_store()
        self.zygote.close()

    @ray.method(num_returns="streaming")
    def run(self, call: Shipment, spec: RankSpec, checkpoint: list):
        """Yields run messages; after CheckpointSaved the next item is its CheckpointData, after
        Result(has_value=True) the Pickled value: the caller takes them without unpickling them.
        The last item is always RankExited."""
        with self._run_lock:
            if spec.run_id in self._stopped_runs:  # torn down before it could start
                return
            snapshot = ray.get(checkpoint[0]) if checkpoint else None
            _sweep_stale_scratch()  # what lost ranks left on this node, even while this actor stays warm
            try:
                claim = scratch.Claim(scratch_dir(spec))
            except NotPrivate as exc:  # its scratch folder is another account's: the rank's error, at once
                yield _refused(spec, exc)
                yield m.RankExited(spec.rank, socket.gethostname(), None, None, True, time.time())
                return
            files: list[int] = []
            result_fd = None
            try:
                # this node's one copy of the call's big buffers, which every rank here maps
                bulk_path = bulk.node_copy(call, bulk.node_directory(self.cluster, spec.lease_id)) if call.sizes else ""
                if bulk_path:
                    files.append(os.open(bulk_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
                result_fd = bulk.result_file(bulk.result_path(spec)) if spec.return_value else None
                pid, conn = self._fork(spec.caller_account,
                                       None if spec.logical_gpus else tuple(spec.node_gpu_ids))
                handoff.send(conn.fileno(), files[0] if bulk_path else None, result_fd)
            except (LaunchRefused, NotPrivate) as exc:  # NotPrivate: its node files' folder is another account's
                claim.release()
                _close_all(files, result_fd)
                yield _refused(spec, exc)
                yield m.RankExited(spec.rank, socket.gethostname(), None, None, True, time.time())
                return
            except BaseException:
                claim.release()
                _close_all(files, result_fd)
                raise
            _close_all(files, result_fd)  # the rank holds its own copies now
            zygote = self.zygote  # the warm parent that forked it: the one that may kill it
            with self._conn_lock:
                self._child, self._conn, self._conn_run = _RankProcess(zygote, pid, spec.run_id), conn, spec.run_id
            finished = threading.Event()
            if spec.group_id:
                threading.Thread(target=_stop_if_group_removed,
                                 args=(spec.group_id, spec.lease_id, zygote, pid, finished),
                                 name="gpusession-lease-watchdog", daemon=True).start()
            clean = False
            try:
                try:
                    conn.send(m.Launch(spec, call.header, bytes(snapshot.data) if snapshot else None,
                                       snapshot.loader_epochs if snapshot else (), bulk_path, call.sizes))
                    for item in _relay(conn, spec):
                        clean = clean or isinstance(item, (m.Result, m.RankError))
                        yield item
                finally:
                    finished.set()
                    with self._conn_lock:
                        self._conn = None
                    conn.close()
                status = zygote.exit_status(pid, EXIT_STATUS_WAIT_S)
                if status is None:  # still running without its pipe: make sure it is gone
                    zygote.kill(pid)
                    status = zygote.exit_status(pid, EXIT_STATUS_WAIT_S) or (None, None)
            except BaseException:  # the relay broke (a rank gone mid-message) or was closed
                zygote.kill(pid)
                zygote.exit_status(pid, EXIT_STATUS_WAIT_S)
                raise
            finally:
                self._child = None  # on every path: a stop() after this must not reach for the pid
                claim.release()  # the last rank of the attempt on this node removes the directory
                if spec.return_value:
                    bulk.unlink(bulk.result_path(spec))  # unused (a small result), or left by a killed rank
            yield m.RankExited(spec.rank, socket.gethostname(), status[0], status[1], clean, time.time())

    def _fork(self, account: str = "", gpus: tuple[str, ...] | None = None, *, role: str = "rank"):
        """A fresh rank process (under the hub: started by the launcher as `account`); a warm
        parent killed while idle (the OOM killer picks big processes) is started again first."""
        as_user = {"account": account, "gpus": gpus, "role": role} if self._launcher else {}
        for _ in range(2):
            if not self.zygote.alive():
                self.zygote = self._new_zygote(restart=True)
                self.zygote.wait_ready(ZYGOTE_START_TIMEOUT_S)
            try:
                return self.zygote.fork(**as_user)
            except LaunchRefused:
                raise
            except (RuntimeError, OSError):  # it died just now: once more with a new one
                if self.zygote.alive():
                    raise
                continue
        return self.zygote.fork(**as_user)

    def _new_zygote(self, *, restart: bool = False) -> Zygote:
        if self._launcher:  # root's launcher: the node's one warm parent, which nobody here restarts
            return Zygote.connect(self._launcher, ZYGOTE_START_TIMEOUT_S)
        if self._zygote_path is None:
            return Zygote.start()
        if restart:  # the node host starts its warm parent again, at the same socket path
            ray.get(ray.get_actor(self._host_name, namespace=NODE_HOST_NAMESPACE).ensure_zygote.remote())
        return Zygote.connect(self._zygote_path, ZYGOTE_START_TIMEOUT_S)

    def _send(self, item, run_id: str | None = None) -> None:
        with self._conn_lock:
            if self._conn is not None and run_id in (None, self._conn_run):
                try:
                    self._conn.send(item)
                except OSError:  # the rank just exited
                    pass


def _close_all(files: list[int], result_fd: int | None) -> None:
    for fd in [*files, *([result_fd] if result_fd is not None else [])]:
        try:
            os.close(fd)
        except OSError:
            pass


def _refused(spec: RankSpec, exc: LaunchRefused | NotPrivate) -> m.RankError:
    """The launcher would not start this rank (its user is unknown on this node, or not one it
    starts), or the folder its files go in is another account's (privatedir.py): the rank's
    error, so the call fails at once naming user and node, or the folder and what to do."""
    return m.RankError(rank=spec.rank, host=socket.gethostname(), type=type(exc).__name__, message=str(exc),
                       traceback="", at=time.time(),
                       mro=tuple(f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__))


def _sweep_stale_scratch() -> None:
    """Scratch directories nobody holds (left by a lost host, a killed actor) go when a worker
    starts on the node (a host starting again, too) and before each rank it starts: a scan of a
    few directories, far below a millisecond."""
    try:
        scratch.remove_stale(scratch_root())
        bulk.remove_stale(lease_scratch_dir)
    except Exception:  # never fail a worker's start over leftovers
        pass


def _relay(conn, spec: RankSpec):
    """Items from the rank's pipe, decoded by wire.py (never unpickled: the rank runs the user's
    code), consecutive output merged (chatty code costs a few stream items, not thousands), until
    the rank closes it. A rank that sends anything but its messages is reported as its error, and
    nothing more is read from it."""
    def receive():
        try:
            return wire.decode(conn.recv_bytes(), conn.recv_bytes, comm=spec.comm)
        except (EOFError, OSError):  # the rank closed its end (it exited, or was killed)
            raise _PipeClosed from None

    held = None
    while True:
        try:
            item = held if held is not None else receive()
            held = None
            if isinstance(item, m.Output):
                chunks = list(item.chunks)
                while held is None and conn.poll(0):
                    try:
                        nxt = receive()
                    except _PipeClosed:
                        break
                    if isinstance(nxt, m.Output):
                        chunks.extend(nxt.chunks)
                    else:
                        held = nxt
                yield m.Output(tuple(chunks))
            elif isinstance(item, m.CheckpointSaved):
                payload = _expect(receive(), m.CheckpointData, item)
                yield item
                yield _out_of_band(payload)  # the rank waits for the caller's ack (checkpoint_kept)
            elif isinstance(item, m.Result):
                payload = _expect(receive(), m.Pickled, item) if item.has_value else None
                if payload is not None and payload.bulk_sizes:
                    arrays, remove = _take_result(spec, payload.bulk_sizes)
                    yield item
                    yield m.BulkValue(payload.data, arrays)  # Ray copies the arrays into the object store here
                    del arrays
                    remove()
                else:
                    yield item
                    if payload is not None:
                        yield payload
            else:
                yield item
        except _PipeClosed:
            return
        except wire.WireError as exc:
            yield _protocol_error(spec, exc)
            return


class _PipeClosed(Exception):
    """The rank's end of the pipe is closed: nothing more will come (only reading raises it, so an
    error while an item is handed on is never mistaken for the rank's end)."""


def _take_result(spec: RankSpec, sizes: tuple[int, ...]):
    try:
        return bulk.take_result(bulk.result_path(spec), sizes)
    except (OSError, ValueError) as exc:
        raise wire.WireError(f"its result's buffers could not be read ({exc})") from None


def _expect(item, kind: type, after):
    if not isinstance(item, kind):
        raise wire.WireError(f"a {type(after).__name__} must be followed by its {kind.__name__}, "
                             f"not a {type(item).__name__}")
    return item


def _protocol_error(spec: RankSpec, exc: wire.WireError) -> m.RankError:
    return m.RankError(
        rank=spec.rank, host=socket.gethostname(), type="ProtocolError",
        message=(f"rank {spec.rank} sent its worker something that is not one of its messages ({exc}); "
                 "gpusession stopped reading it and ended the rank. Code that writes to gpusession's pipe "
                 "(its file descriptor) breaks the run."),
        traceback="", at=time.time(), mro=("gpusession.run.wire.WireError", "builtins.ValueError"))


def _out_of_band(payload: m.CheckpointData) -> m.CheckpointData:
    """The checkpoint's bytes as a numpy array over them (no copy): Ray stores an array out of
    band, so the caller maps its copy and puts it in its own object store with one memcpy and
    no unpickling."""
    import numpy

    return dataclasses.replace(payload, data=numpy.frombuffer(payload.data, dtype=numpy.uint8))


def _stop_if_group_removed(group_id: str, lease_id: int, zygote: Zygote, pid: int,
                           finished: threading.Event) -> None:
    """The lease's GPUs are held by its placement group, not by this process: if the broker
    takes them back by force (the caller ignored a revoke or preemption, or cannot be reached),
    stop computing on GPUs now lent to others."""
    from ray.util.placement_group import PlacementGroup

    group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))
    while not finished.wait(WATCHDOG_POLL_S):
        try:
            state = PlacementState.parse(ray.util.placement_group_table(group).get("state"))
        except Exception:  # GCS briefly unreachable: ask again next time
            continue
        if state is PlacementState.REMOVED and not finished.is_set():
            os.write(2, f"gpusession: lease {lease_id} was taken back; stopping its rank process.\n".encode())
            zygote.kill(pid)
            return
