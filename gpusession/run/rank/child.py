"""One rank of one attempt, in a fresh process forked from the node's zygote.

It receives its Launch over the pipe to its worker actor, sets torchrun's variables and its GPUs
before anything can touch CUDA, joins the process group (process_group.py: a torchrun script's
own init_process_group call finds it ready), runs the user's function with stdout
and stderr captured at the file-descriptor level, sends what happens as typed messages, and
exits. Nothing it changes (module globals, library state, environment, working directory,
threads) outlives it, and exiting gives its GPU memory back.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from .. import bulk
from .. import handoff
from .. import messages as m
from .. import wire
from .heap import keep_freed_memory  # imported by the warm parent (PRELOAD), not by each rank

ACCELERATE_CPU_ENV = {"ACCELERATE_USE_CPU": "true"}  # what `accelerate launch --cpu` sets


class Channel:
    """The rank's side of the pipe: sends are atomic across threads (capture pumps, the user's
    thread) and never pickled (wire.py); replies (checkpoint acks, checkpoint requests, pickled
    by the worker actor: the rank trusts the service, not the other way round) are read by one
    thread."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._acks = threading.Semaphore(0)
        self.checkpoint_requested = threading.Event()
        self.checkpoint_withdrawn = threading.Event()  # set when a request is taken back
        self.checkpoint_reason = ""

    def send(self, *items) -> None:
        """Each item as wire.py's frames: JSON, then its raw bytes if it carries any (no pickle)."""
        with self._send_lock:
            for item in items:
                header, data = wire.encode(item)
                self.conn.send_bytes(header)
                if data is not None:
                    self.conn.send_bytes(data)

    def listen(self) -> None:
        threading.Thread(target=self._read, name="gpusession-rank-control", daemon=True).start()

    def wait_ack(self) -> None:
        self._acks.acquire()

    def _read(self) -> None:
        while True:
            try:
                item = self.conn.recv()
            except (EOFError, OSError):
                os._exit(75)  # the worker actor is gone: nobody will ever read our results
            if isinstance(item, m.CheckpointAck):
                self._acks.release()
            elif isinstance(item, m.ShouldCheckpoint) and item.wanted:
                self.checkpoint_reason = item.reason
                self.checkpoint_withdrawn.clear()
                self.checkpoint_requested.set()
            elif isinstance(item, m.ShouldCheckpoint):
                self.checkpoint_requested.clear()
                self.checkpoint_withdrawn.set()


def main(fd: int) -> None:
    """Entry point in the forked process; never returns."""
    conn = Connection(fd)
    code = 0
    try:
        files = handoff.receive(fd)  # the files it may use, opened by its worker actor
        launch: m.Launch | m.ServeStore = conn.recv()
        if isinstance(launch, m.ServeStore):  # not a rank: the attempt's rendezvous store (store.py)
            from ..store import serve

            serve(conn, launch)
            return
        keep_freed_memory()  # before the user's code: see heap.py
        channel = Channel(conn)
        channel.listen()
        code = _run(launch, channel, files)
    except BaseException:  # gpusession's own machinery failed before the function could run
        traceback.print_exc()
        code = 71
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(launch: m.Launch, channel: Channel, files: tuple[int | None, int | None] = (None, None)) -> int:
    from .capture import FdCapture, flush_all

    spec = launch.spec
    _set_environment(spec)
    with FdCapture(lambda stream, text: channel.send(m.Output(((stream, text),)))):
        try:
            outcome = _call(launch, channel, files)
        finally:
            flush_all()
    if isinstance(outcome, m.RankError):
        channel.send(outcome)
        return 0
    channel.send(*outcome)
    return 0


def _call(launch: m.Launch, channel: Channel, files: tuple[int | None, int | None]):
    from . import context as ctx_module
    from .process_group import RankGroup
    spec = launch.spec
    try:
        group = RankGroup(spec)
        group.install()  # the script's own init_process_group call then finds the group ready
        bulk_fd, result_fd = files
        fn, args, kwargs = bulk.unpack(launch.call, bulk_fd if bulk_fd is not None else launch.bulk_path,
                                       launch.bulk_sizes)
        group.join()
        run = ctx_module._Run(_make_context(spec), channel, launch.checkpoint, launch.loader_epochs,
                              comm_options=spec.comm)
        ctx_module._current = run
        channel.send(m.Started(time.time(), socket.gethostname(), spec.address, os.getpid()))
        result = fn(*args, **kwargs)
    except BaseException as exc:
        # The process group is left alone: the process exits right after this, which closes
        # its sockets; the caller tells this root cause from the peers' echoes of it.
        return _error(exc, spec)
    # The process group is not destroyed: the process exits right after sending its result (as a
    # torchrun script that returns without destroy_process_group does), which closes its sockets
    # and frees its GPU memory; destroying it first would add ~20 ms to every call.
    report = ctx_module.communication_report(run) if spec.rank == 0 else None
    before = (m.Communication(report),) if report is not None else ()
    if not spec.return_value:
        return (*before, m.Result(False))
    try:
        data, sizes = bulk.pack_result(result, result_fd if result_fd is not None else bulk.result_path(spec))
    except Exception as exc:
        return _error(TypeError(f"The function's return value could not be pickled: {exc}"), spec)
    return (*before, m.Result(True, len(data) + sum(sizes)), m.Pickled(data, sizes))


def _error(exc: BaseException, spec) -> m.RankError:
    names = tuple(f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__)
    message = str(exc)
    return m.RankError(
        rank=spec.rank, host=socket.gethostname(), type=type(exc).__name__, message=message,
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        at=time.time(), mro=names,
    )


def _set_environment(spec) -> None:
    """torchrun's variables and the lease's GPUs first; then the caller's directory when the
    rank runs on the caller's host, so code next to the notebook imports as it does there."""
    from ..spec import scratch_dir

    os.environ.update({
        "RANK": str(spec.rank), "LOCAL_RANK": str(spec.local_rank),
        "WORLD_SIZE": str(spec.world_size), "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GROUP_RANK": str(spec.node_rank), "NODE_RANK": str(spec.node_rank),
        "ROLE_RANK": str(spec.rank), "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(spec.attempt),
        "CUDA_VISIBLE_DEVICES": ",".join(spec.node_gpu_ids),
        "GPUSESSION_LEASE_ID": str(spec.lease_id), "GPUSESSION_ATTEMPT": str(spec.attempt),
    })
    from .ray_guard import install

    install()  # ray.* inside the function fails at once, saying what to use instead
    if spec.logical_gpus:
        for key, value in ACCELERATE_CPU_ENV.items():
            os.environ.setdefault(key, value)
    if spec.address:  # gloo/nccl bind to the interface of the Ray node IP, whatever the host name says
        from ...cluster.netif import socket_ifname_env

        os.environ.update(socket_ifname_env(spec.address))
    os.makedirs(scratch_dir(spec), exist_ok=True)  # the actor made it; a stale sweep may not have
    # The caller's folder, when this rank's account may enter it (behind `gpusession hub` the rank
    # is its user; the launcher started it in the user's home otherwise)
    if spec.caller_host == socket.gethostname() and os.access(spec.caller_cwd, os.R_OK | os.X_OK) \
            and os.path.isdir(spec.caller_cwd):
        os.chdir(spec.caller_cwd)
        sys.path.insert(0, spec.caller_cwd)


def _make_context(spec):
    import torch

    from .context import RunContext
    from .process_group import local_devices
    from ..spec import scratch_dir

    if not spec.logical_gpus and torch.cuda.is_available():
        devices = tuple(torch.device("cuda", i) for i in local_devices(spec))
    else:
        devices = (torch.device("cpu"),)
    return RunContext(
        rank=spec.rank, world_size=spec.world_size, local_rank=spec.local_rank,
        local_world_size=spec.local_world_size, node_rank=spec.node_rank, device=devices[0],
        devices=devices, backend=spec.backend, lease_id=spec.lease_id,
        scratch_dir=scratch_dir(spec), gpu_ids=spec.gpu_ids,
        logical_gpus=spec.logical_gpus, restarts=spec.attempt, attempt=spec.attempt,
        host=socket.gethostname(), address=spec.address, node_id=spec.node_id,
    )
