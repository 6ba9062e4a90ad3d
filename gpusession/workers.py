"""The worker actor: a warm Python process (torch imported, CUDA untouched) that runs one rank.

A worker lives outside the lease's placement group so it can serve many calls without paying
process start and `import torch` (~2-4 s) again; the lease's group holds the GPUs, and the
worker is told which of them are its own (CUDA_VISIBLE_DEVICES) before anything touches CUDA.
A worker that initialised CUDA is never reused for another lease: it is killed after the run,
which also gives the GPU memory back.
"""
from __future__ import annotations

import importlib
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import cloudpickle
import ray

# the package exports the function `context`, which hides the module of the same name
ctx_module = importlib.import_module("gpusession.context")

from .capture import FdCapture, flush_all
from .netif import socket_ifname_env
from .shipping import is_user_file

_DONE = object()


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    backend: str
    node_gpu_ids: tuple[str, ...]  # every GPU of the lease on this node, in order
    gpu_ids: tuple[str, ...]  # this worker's own GPUs (a subset of node_gpu_ids)
    lease_id: int
    logical_gpus: bool
    return_value: bool  # rank 0, or every rank with return_all
    caller_host: str
    caller_cwd: str
    pg_timeout_s: float
    run_id: str = ""  # unique per run: the rendezvous keys live under it
    group_id: str | None = None  # the lease's placement group: if it is removed, this worker stops
    restarts: int = 0


def scratch_dir(lease_id: int) -> str:
    return os.path.join(tempfile.gettempdir(), "gpusession-scratch", f"lease-{lease_id}")


class Worker:
    def __init__(self) -> None:
        import torch  # noqa: F401  (the point: pay the import once, before any call)
        import torch.distributed  # noqa: F401

        self.node_id = ray.get_runtime_context().get_node_id()
        self.address = ray.util.get_node_ip_address()
        self._store = None  # rank 0's TCPStore between open_rendezvous and the run
        self._served_store = None  # the store of rank 0's last run

    def info(self) -> dict:
        return {"node_id": self.node_id, "address": self.address, "pid": os.getpid(),
                "host": socket.gethostname()}

    def open_rendezvous(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0 only: bind the run's TCPStore on a port the OS picks, and keep it for the run.
        Binding here (not "find a free port, close it, bind it later") leaves no gap in which
        another process, or another run, could take the port."""
        from torch.distributed import TCPStore

        self._store = TCPStore(self.address, 0, world_size, is_master=True,
                               timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        return self.address, self._store.port

    def cleanup(self, lease_id: int) -> None:
        shutil.rmtree(scratch_dir(lease_id), ignore_errors=True)

    @ray.method(num_returns="streaming")
    def run(self, call: bytes, spec: RankSpec, checkpoint: list):
        """Yields event tuples; after ("checkpoint", n) or ("result", True) the next item is the
        object itself, so the caller can keep it in the object store without fetching it."""
        events: queue.Queue = queue.Queue()
        runner = threading.Thread(target=self._execute, args=(call, spec, checkpoint, events),
                                  name=f"gpusession-rank-{spec.rank}", daemon=True)
        finished = threading.Event()
        if spec.group_id:
            threading.Thread(target=_exit_if_group_removed, args=(spec.group_id, spec.lease_id, finished),
                             name="gpusession-lease-watchdog", daemon=True).start()
        runner.start()
        try:
            yield from _stream(events)
        finally:
            finished.set()

    def _execute(self, call: bytes, spec: RankSpec, checkpoint: list, events: queue.Queue) -> None:
        def emit(event: tuple):
            if event[0] == "checkpoint":
                committed = threading.Event()
                events.put(("checkpoint", event[1], committed))
                return committed
            events.put(event)
            return None

        cuda_used = False
        try:
            with _environment(spec), FdCapture(lambda stream, text: events.put(("out", stream, text))):
                try:
                    outcome = self._call(call, spec, checkpoint, emit)
                finally:
                    cuda_used = _cuda_initialised()
                    flush_all()
            if outcome[0] == "ok":
                if spec.return_value:
                    events.put(("result", True))
                    events.put(("value", outcome[1], None))
                else:
                    events.put(("result", False))
            else:
                events.put(("error", outcome[1]))
        except BaseException as exc:  # gpusession's own machinery failed: still report it
            events.put(("error", _error_info(exc, spec)))
        finally:
            events.put(("end", {"cuda_used": cuda_used}))
            events.put(_DONE)

    def _call(self, call: bytes, spec: RankSpec, checkpoint: list, emit) -> tuple:
        import torch.distributed as dist

        try:
            fn, args, kwargs = cloudpickle.loads(call)
            store, self._store = self._store, None
            if store is not None:  # rank 0 serves the rendezvous until its next run, so no peer
                self._served_store = store  # still waiting on its last answer is ever cut off
            _init_process_group(spec, store)
            run = ctx_module._Run(_make_context(spec), emit, checkpoint)
            ctx_module._current = run
            emit(("started", time.time()))
            try:
                result = fn(*args, **kwargs)
            finally:
                ctx_module._current = None
        except BaseException as exc:
            # Leave the process group alone: tearing it down would break the peers' collectives
            # and their errors could reach the caller before this, the real one. The caller
            # kills every worker of a failed run anyway.
            return ("error", _error_info(exc, spec))
        if dist.is_initialized():
            dist.destroy_process_group()
        return ("ok", result)


def _stream(events: queue.Queue):
    held = None
    while True:
        item, held = (held if held is not None else events.get()), None
        if item is _DONE:
            return
        if item[0] == "out":
            item, held = _merge_output(item, events)
        if item[0] in ("checkpoint", "value"):
            kind, payload, committed = item
            if kind == "checkpoint":
                yield ("checkpoint",)
            yield payload
            if committed is not None:
                committed.set()
            continue
        yield item


WATCHDOG_POLL_S = 1.0


def _exit_if_group_removed(group_id: str, lease_id: int, finished: threading.Event) -> None:
    """The lease's GPUs are held by its placement group, not by this process: if the broker
    takes them back by force (the caller ignored a revoke or preemption, and the broker cannot
    reach this process, e.g. after its own restart), stop computing on GPUs now lent to others."""
    from ray.util.placement_group import PlacementGroup

    group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))
    while not finished.wait(WATCHDOG_POLL_S):
        try:
            state = ray.util.placement_group_table(group).get("state")
        except Exception:  # GCS briefly unreachable: ask again next time
            continue
        if state == "REMOVED" and not finished.is_set():
            os.write(2, f"gpusession: lease {lease_id} was taken back; stopping this worker.\n".encode())
            os._exit(1)


def _merge_output(first: tuple, events: queue.Queue) -> tuple[tuple, object]:
    """Coalesce output already waiting, so chatty code costs a few stream items, not thousands.
    Returns the merged item and the first non-output item taken off the queue (or None)."""
    chunks = [(first[1], first[2])]
    while True:
        try:
            nxt = events.get_nowait()
        except queue.Empty:
            return ("out", chunks), None
        if nxt is _DONE or nxt[0] != "out":
            return ("out", chunks), nxt
        chunks.append((nxt[1], nxt[2]))


def _error_info(exc: BaseException, spec: RankSpec) -> dict:
    return {
        "rank": spec.rank,
        "node": socket.gethostname(),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": time.time(),
    }


@contextmanager
def _environment(spec: RankSpec):
    """torchrun's variables, the lease's GPUs, the caller's directory when on the same host.

    A warm worker serves many calls, so everything a run may change is put back afterwards:
    the whole environment, sys.path, the cwd, and modules it imported from the caller's
    directory (so a module the user edits is imported afresh by the next call)."""
    saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
    modules_before = set(sys.modules)
    os.environ.update({
        "RANK": str(spec.rank), "LOCAL_RANK": str(spec.local_rank),
        "WORLD_SIZE": str(spec.world_size), "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GROUP_RANK": str(spec.node_rank), "NODE_RANK": str(spec.node_rank),
        "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
        "CUDA_VISIBLE_DEVICES": ",".join(spec.node_gpu_ids),
        "GPUSESSION_LEASE_ID": str(spec.lease_id),
    })
    # gloo/nccl on the interface of this node's Ray IP, unless the user or admin chose one
    os.environ.update(socket_ifname_env(ray.util.get_node_ip_address()))
    os.makedirs(scratch_dir(spec.lease_id), exist_ok=True)
    if spec.caller_host == socket.gethostname() and os.path.isdir(spec.caller_cwd):
        os.chdir(spec.caller_cwd)
        sys.path.insert(0, spec.caller_cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        _forget_modules_from(spec.caller_cwd, set(sys.modules) - modules_before)


def _forget_modules_from(directory: str, names: set[str]) -> None:
    """Drop the user's own modules this run imported; never a library's (torch registers
    operators at import and must not be imported twice)."""
    roots = (os.path.realpath(directory) + os.sep,)
    for name in names:
        if is_user_file(getattr(sys.modules.get(name), "__file__", None), roots):
            del sys.modules[name]


def _init_process_group(spec: RankSpec, store) -> None:
    import torch.distributed as dist

    if spec.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"backend='nccl' needs CUDA, but torch on {socket.gethostname()} sees no GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use backend='gloo'."
            )
        torch.cuda.set_device(_local_devices(spec)[0])
    timeout = timedelta(seconds=spec.pg_timeout_s)
    if store is None:  # every rank but 0 joins the store rank 0 opened
        store = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size, is_master=False,
                              timeout=timeout)
    # Keys under this run's own prefix: nothing of another run can ever be read by mistake.
    scoped = dist.PrefixStore(f"gpusession/{spec.lease_id}/{spec.run_id}/", store)
    dist.init_process_group(spec.backend, store=scoped, rank=spec.rank, world_size=spec.world_size,
                            timeout=timeout)
    # Each rank connects its own side of gloo's mesh. Without this barrier a rank whose function
    # does no collective could finish, close its sockets, and fail a peer still connecting
    # ("Gloo connectFullMesh failed ... Connection closed by peer").
    scoped.set(f"connected/{spec.rank}", "1")
    scoped.wait([f"connected/{rank}" for rank in range(spec.world_size)], timeout)


def _local_devices(spec: RankSpec) -> list[int]:
    return [spec.node_gpu_ids.index(gpu) for gpu in spec.gpu_ids]


def _make_context(spec: RankSpec) -> ctx_module.RunContext:
    import torch

    if not spec.logical_gpus and torch.cuda.is_available():
        devices = tuple(torch.device("cuda", i) for i in _local_devices(spec))
    else:
        devices = (torch.device("cpu"),)
    return ctx_module.RunContext(
        rank=spec.rank, world_size=spec.world_size, local_rank=spec.local_rank,
        local_world_size=spec.local_world_size, node_rank=spec.node_rank, device=devices[0],
        devices=devices, backend=spec.backend, lease_id=spec.lease_id,
        scratch_dir=scratch_dir(spec.lease_id), gpu_ids=spec.gpu_ids,
        logical_gpus=spec.logical_gpus, restarts=spec.restarts,
    )


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False
