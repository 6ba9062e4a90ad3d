"""Big arguments travel once per node, not once per rank (issue 33).

The caller pickles the call with protocol 5: every numpy array and CPU tensor of at least
OUT_OF_BAND_MIN bytes leaves the pickle as an out-of-band buffer (no copy), and the buffers go
into Ray's object store once (one copy, in shared memory, not the caller's heap). On each node
the first worker actor of the call fetches them (Ray moves them to the node once) and writes
them into one file in /dev/shm (in the account's own 0700 directory there: node_base); every
rank of the node maps that file copy-on-write and unpickles the call over it, so arrays and
tensors arrive without a copy per rank: a rank that writes into one gets a private copy of the
pages it writes. The file goes when the lease ends (Worker.cleanup), or with the stale sweep
when the caller died without ending it.

Tensors are shipped as numpy arrays over their memory: dtype, shape, strides and requires_grad
come back; two tensors that were views of one storage arrive as separate tensors.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

from .privatedir import private_dir
from .shipping import call_arguments, dumps_with_buffers

OUT_OF_BAND_MIN = 1 << 20  # smaller buffers stay inside the pickle: not worth a trip of their own
NODE_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, not disk
STALE_AFTER_S = 60.0


@dataclass(frozen=True)
class Shipment:
    """The call as the ranks get it: the pickle, and where its big buffers are."""

    header: bytes
    sizes: tuple[int, ...] = ()  # each out-of-band buffer's length, in order
    refs: tuple = ()  # (ObjectRef,) of the list of buffers, wrapped so Ray does not resolve it
    seconds: float = 0.0  # pickling and the object-store put, in the caller

    @property
    def bulk_bytes(self) -> int:
        return sum(self.sizes)


def ship(fn: Any, args: tuple, kwargs: dict) -> Shipment:
    """The call as the ranks get it: ObjectRef arguments fetched, the code beside the caller
    pickled by value (shipping.py), big buffers out of band and in the object store once."""
    args, kwargs = call_arguments(args, kwargs)
    return pack((fn, args, kwargs))


def pack(obj: Any) -> Shipment:
    """Pickle obj, its big buffers out of band, and put those in the object store once."""
    started = time.perf_counter()
    header, buffers = pickle_out_of_band(obj)
    return shipment_of(header, [buffer.raw() for buffer in buffers], started=started)


def pickle_out_of_band(obj: Any) -> tuple[bytes, list]:
    """obj pickled with protocol 5: the pickle, and its big buffers (pickle.PickleBuffer, in
    order) left out of it, not copied. Imports no Ray: a kernel behind the gateway pickles here."""
    buffers: list = []

    def out_of_band(buffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_MIN:
            return True  # in band
        buffers.append(buffer)
        return False

    return dumps_with_buffers(obj, out_of_band, tensor_reducers()), buffers


def shipment_of(header: bytes, buffers: list, *, started: float | None = None) -> Shipment:
    """A Shipment of a call already pickled (here, or by a kernel behind the gateway, whose bytes
    the service never unpickles): its big buffers (bytes-like, in order) go into the object store
    once."""
    started = time.perf_counter() if started is None else started
    if not buffers:
        return Shipment(header, seconds=time.perf_counter() - started)
    import numpy
    import ray

    arrays = [numpy.frombuffer(buffer, dtype=numpy.uint8) for buffer in buffers]
    try:
        ref = ray.put(arrays)  # one copy, into shared memory
    except (ray.exceptions.ObjectStoreFullError, ray.exceptions.OutOfDiskError) as exc:
        total = sum(a.nbytes for a in arrays)
        raise ValueError(
            f"The call's arrays and tensors ({total / 1e6:,.0f} MB) do not fit in Ray's object store now "
            f"({type(exc).__name__}); nothing was leased. Pass a path on storage the ranks can read and open "
            "it in the function, or give the cluster more --object-store-memory.") from None
    return Shipment(header, tuple(a.nbytes for a in arrays), (ref,), time.perf_counter() - started)


def node_base() -> str:
    """This account's own directory for node files (made 0700 if missing, and checked: see
    privatedir.py). /dev/shm is every account's to write, and the name is public: a directory of
    another account there would see, swap or link what the worker actors write. It is never
    removed, so its name cannot be taken once it was used; what lies inside is safe, as nobody
    else may enter it."""
    return private_dir(NODE_ROOT or os.environ.get("TMPDIR", "/tmp"), f"gpusession-{os.geteuid()}",
                       holds="node files (big call arguments and results)")


def node_directory(cluster: str, lease_id: int) -> str:
    return os.path.join(node_base(), cluster or "no-cluster", f"lease-{lease_id}")


def node_copy(shipment: Shipment, directory: str) -> str:
    """In a worker actor: the path of this node's copy of the call's buffers, written by the
    first actor of the node that needs it (the others wait on its lock and use it). Named by the
    Ray node too: hosts simulated on one machine (network namespaces) share /dev/shm, and each
    must fetch its own copy through its own object store, as a real host does."""
    import ray

    os.makedirs(directory, mode=0o700, exist_ok=True)
    node = ray.get_runtime_context().get_node_id()[:12]
    path = os.path.join(directory, f"{node}-{shipment.refs[0].hex()}")
    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            arrays = ray.get(shipment.refs[0])  # zero-copy views of this node's object store
            partial = f"{path}.partial"
            _unlink(partial)  # left by an actor killed while writing it
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as out:
                for array in arrays:
                    out.write(memoryview(array))
            del arrays
            os.replace(partial, path)
    finally:
        os.close(lock)  # the flock goes with it
    return path


def unpack(header: bytes, source: str | int, sizes: tuple[int, ...]) -> Any:
    """In a rank: the call, its big buffers mapped copy-on-write from the node's file (its path,
    or a descriptor the worker actor opened and passed: a rank run as its user cannot open the
    service's file, and needs no right to)."""
    import cloudpickle

    if not sizes:
        return cloudpickle.loads(header)
    if isinstance(source, int):
        mapped = mmap.mmap(source, 0, access=mmap.ACCESS_COPY)
    else:
        with open(source, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    view, offset, buffers = memoryview(mapped), 0, []
    for size in sizes:
        buffers.append(view[offset:offset + size])
        offset += size
    return cloudpickle.loads(header, buffers=buffers)


def result_path(spec) -> str:
    """Where a rank leaves its result's big buffers for its worker actor (who knows it too)."""
    return os.path.join(node_directory(spec.cluster, spec.lease_id), f"result-{spec.run_id}-{spec.rank}")


def pack_result(value: Any, path: str | int) -> tuple[bytes, tuple[int, ...]]:
    """In a rank: the pickle of its return value, and the sizes of the big buffers it wrote to
    `path` (or the descriptor of the file its worker actor made for it; none: everything is in
    the pickle)."""
    buffers: list = []

    def out_of_band(buffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(buffer)
        return False

    header = dumps_with_buffers(value, out_of_band, tensor_reducers())
    if not buffers:
        return header, ()
    if isinstance(path, int):
        os.ftruncate(path, 0)
    else:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb", closefd=not isinstance(path, int)) as out:
        for buffer in buffers:
            out.write(buffer.raw())
    return header, tuple(buffer.raw().nbytes for buffer in buffers)


def result_file(path: str) -> int:
    """In the worker actor: a new, empty result file for one rank (the service's, 0600) opened
    for writing; its descriptor goes to the rank, which may then write there as its own user."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _unlink(path)  # a rank of the same attempt killed before its actor removed it
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def take_result(path: str, sizes: tuple[int, ...]):
    """In the worker actor: the arrays over a rank's result file (read-only, mapped, not copied)
    and a function that removes the file once Ray holds its copy. The rank does not name the
    file: the actor opens the one it expects, never through a symlink, and its length must be
    the sizes' sum."""
    import numpy

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != sum(sizes):
            raise ValueError(f"the result file holds {os.fstat(fd).st_size} bytes, not the {sum(sizes)} announced")
        mapped = mmap.mmap(fd, sum(sizes), access=mmap.ACCESS_READ) if sum(sizes) else b""
    finally:
        os.close(fd)
    arrays, offset = [], 0
    for size in sizes:
        arrays.append(numpy.frombuffer(mapped, dtype=numpy.uint8, count=size, offset=offset))
        offset += size
    return tuple(arrays), lambda: _unlink(path)


def loads_value(value: Any) -> Any:
    """In the caller: a rank's returned value (messages.Pickled or BulkValue). A BulkValue's
    buffers come from the object store read-only: each is copied once, so what the caller gets
    is its own and writable."""
    if value is None:
        return None
    header, buffers = value_frames(value)
    return loads_frames(header, [bytearray(buffer) for buffer in buffers])


def value_frames(value: Any) -> tuple[bytes, tuple]:
    """A rank's returned value (messages.Pickled or BulkValue) as its pickle and its big buffers,
    still pickled: the gateway sends these to the caller's kernel as they are."""
    header = getattr(value, "header", None)
    if header is None:
        return value.data, ()
    return header, tuple(value.buffers)


def value_size(value: Any) -> int:
    """The bytes of a rank's returned value as it travels (its pickle and its big buffers); 0 for none."""
    if value is None:
        return 0
    header, buffers = value_frames(value)
    return len(header) + sum(memoryview(buffer).nbytes for buffer in buffers)


def loads_frames(header: bytes, buffers: list) -> Any:
    """The value of a pickle and its out-of-band buffers (writable ones: the value owns them)."""
    import cloudpickle

    return cloudpickle.loads(header, buffers=buffers) if buffers else cloudpickle.loads(header)


def unlink(path: str) -> None:
    _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_lease(cluster: str, lease_id: int) -> None:
    """The lease's node files go, and its cluster's directory with them once it holds no lease
    (this account's own base directory stays: node_base)."""
    lease_dir = node_directory(cluster, lease_id)
    shutil.rmtree(lease_dir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(lease_dir))
    except OSError:  # another lease of the cluster still has files here (or it is gone already)
        pass


def remove_stale(scratch_lease_dir, *, now: float | None = None) -> list[str]:
    """Node copies of leases whose scratch directory is gone (the sweep removed it: no live rank
    holds the lease here) and that were not touched for STALE_AFTER_S. `scratch_lease_dir(cluster,
    lease_id)` says where a lease's scratch directory is."""
    now = time.time() if now is None else now
    removed = []
    for cluster_dir in _subdirs(node_base(), ""):  # this account's own: never another's files
        cluster = os.path.basename(cluster_dir)
        for lease_dir in _subdirs(cluster_dir, "lease-"):
            lease_id = os.path.basename(lease_dir)[len("lease-"):]
            if not lease_id.isdigit() or os.path.isdir(scratch_lease_dir(cluster, int(lease_id))):
                continue
            try:
                if now - os.stat(lease_dir).st_mtime < STALE_AFTER_S:
                    continue
            except OSError:
                continue
            shutil.rmtree(lease_dir, ignore_errors=True)
            removed.append(lease_dir)
    return removed


def _subdirs(path: str, prefix: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(path)
                if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


# ----- tensors as numpy arrays over their memory (pickled out of band, like numpy's own) -------------
def tensor_reducers() -> dict:
    """Reducers for CPU tensors and parameters, when torch is imported in this process (a caller
    that never imported torch has none to ship)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {torch.Tensor: _reduce_tensor, torch.nn.Parameter: _reduce_parameter}


def _as_array(tensor):
    """(array over the tensor's memory, dtype name) or None when it must travel as torch pickles it."""
    import torch

    if (tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.is_quantized
            or tensor.is_conj() or tensor.is_neg() or tensor._base is not None
            or tensor.numel() * tensor.element_size() < OUT_OF_BAND_MIN):
        return None
    plain = tensor.detach()
    if plain.dtype == torch.bfloat16:
        return plain.view(torch.int16).numpy(), "bfloat16"
    try:
        return plain.numpy(), ""
    except (TypeError, RuntimeError):  # a dtype numpy lacks
        return None


def _reduce_tensor(tensor):
    found = _as_array(tensor)
    if found is None:
        return tensor.__reduce_ex__(5)
    return (tensor_from_array, (found[0], found[1], tensor.requires_grad))


def _reduce_parameter(parameter):
    found = _as_array(parameter)
    if found is None:
        return parameter.__reduce_ex__(5)
    return (parameter_from_array, (found[0], found[1], parameter.requires_grad))


def tensor_from_array(array, view_as: str, requires_grad: bool):
    import torch

    tensor = torch.from_numpy(array)
    if view_as:
        tensor = tensor.view(getattr(torch, view_as))
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def parameter_from_array(array, view_as: str, requires_grad: bool):
    import torch

    return torch.nn.Parameter(tensor_from_array(array, view_as, False), requires_grad=requires_grad)
