"""Big arguments out of band (run/bulk.py): arrays and CPU tensors leave the pickle as buffers and
come back equal, over a node file mapped copy-on-write; small ones stay inside the pickle."""
from __future__ import annotations

import os
import stat
import subprocess
import time

import cloudpickle
import numpy
import pytest
import torch

from gpusession.run import bulk
from gpusession.run.shipping import dumps_with_buffers
from gpusession.run.spec import RankSpec

BIG = bulk.OUT_OF_BAND_MIN // 4 + 1  # float32 elements: just over the out-of-band minimum


def split(obj):
    """(pickle, out-of-band buffers as bytes) the way bulk.pack splits a call."""
    buffers = []

    def out_of_band(buffer):
        if buffer.raw().nbytes < bulk.OUT_OF_BAND_MIN:
            return True
        buffers.append(bytes(buffer.raw()))
        return False

    return dumps_with_buffers(obj, out_of_band, bulk.tensor_reducers()), buffers


def through_a_node_file(tmp_path, obj):
    header, buffers = split(obj)
    path = tmp_path / "node-copy"
    path.write_bytes(b"".join(buffers))
    return bulk.unpack(header, str(path), tuple(len(b) for b in buffers)), header, buffers


def test_a_big_array_leaves_the_pickle_and_comes_back_equal_and_writable(tmp_path):
    data = numpy.arange(BIG, dtype=numpy.float32)
    back, header, buffers = through_a_node_file(tmp_path, {"x": data})
    assert len(header) < 10_000 and [len(b) for b in buffers] == [data.nbytes]
    assert numpy.array_equal(back["x"], data) and back["x"].flags.writeable


def test_a_rank_writing_into_a_shipped_array_changes_only_its_own_copy(tmp_path):
    data = numpy.zeros(BIG, dtype=numpy.float32)
    back, _, _ = through_a_node_file(tmp_path, data)
    back[0] = 7.0
    again = bulk.unpack(*split(data)[:1], str(tmp_path / "node-copy"), (data.nbytes,))
    assert again[0] == 0.0  # another rank mapping the same node file sees the original


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_cpu_tensors_travel_out_of_band_with_dtype_shape_and_grad_flag(tmp_path, dtype):
    tensor = torch.ones(bulk.OUT_OF_BAND_MIN // 2, 2, dtype=dtype)  # at least the minimum in any dtype
    grad = torch.ones(BIG, requires_grad=True)
    back, _, buffers = through_a_node_file(tmp_path, (tensor, grad))
    assert len(buffers) == 2
    assert back[0].dtype == dtype and back[0].shape == tensor.shape and torch.equal(back[0], tensor)
    assert back[1].requires_grad and torch.equal(back[1].detach(), grad.detach())


def test_a_models_parameters_travel_out_of_band_and_a_tied_one_stays_one(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(BIG // 8, 8), torch.nn.Linear(8, 8))
    model.tied = model[0].weight  # one Parameter in two places, as tied embeddings are
    back, _, buffers = through_a_node_file(tmp_path, model)
    assert len(buffers) == 1  # the big weight once; the small layer stays in the pickle
    assert isinstance(back[0].weight, torch.nn.Parameter) and back[0].weight.requires_grad
    assert torch.equal(back[0].weight, model[0].weight) and back.tied is back[0].weight


def test_small_arrays_views_and_unusual_tensors_stay_inside_the_pickle(tmp_path):
    base = torch.arange(BIG, dtype=torch.float32)
    objects = (numpy.arange(10), torch.ones(3), base[1:], torch.ones(2, dtype=torch.complex64))
    header, buffers = split(objects)
    assert buffers == []
    back = cloudpickle.loads(header)
    assert torch.equal(back[2], base[1:]) and back[0].tolist() == list(range(10))


def test_a_call_without_big_buffers_needs_no_node_file():
    shipment = bulk.pack((len, ([1, 2, 3],), {}))
    assert shipment.sizes == () and shipment.refs == ()
    fn, args, kwargs = bulk.unpack(shipment.header, "", ())
    assert fn(*args) == 3


@pytest.fixture
def node_root(tmp_path, monkeypatch):
    """A folder like /dev/shm (every account's to write, sticky) as the node files' root."""
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o1777)
    monkeypatch.setattr(bulk, "NODE_ROOT", str(root))
    return root


def rank_spec(cluster: str, lease_id: int, rank: int) -> RankSpec:
    return RankSpec(rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0, master_addr="",
                    master_port=0, backend="gloo", node_gpu_ids=(), gpu_ids=(), lease_id=lease_id,
                    logical_gpus=True, return_value=True, caller_host="", caller_cwd="", pg_timeout_s=1.0,
                    run_id=f"run-{lease_id}", cluster=cluster)


def lease_files(cluster: str, lease_id: int) -> str:
    """A lease's node files as a worker actor leaves them: the node copy and its lock, and a
    rank's result file (made by bulk.result_file, as the actor does)."""
    directory = bulk.node_directory(cluster, lease_id)
    os.makedirs(directory, mode=0o700)
    for name in ("node-ref", "node-ref.lock"):
        with open(os.path.join(directory, name), "wb") as out:
            out.write(b"x")
    os.close(bulk.result_file(bulk.result_path(rank_spec(cluster, lease_id, 1))))
    return directory


def everything_under(root) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_a_leases_node_files_lie_in_this_accounts_own_private_folder(node_root):
    base = node_root / f"gpusession-{os.geteuid()}"
    lease_files("session_a", 1)
    found = os.lstat(base)
    assert found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) == 0o700
    assert everything_under(node_root) == [
        base.name, f"{base.name}/session_a", f"{base.name}/session_a/lease-1",
        f"{base.name}/session_a/lease-1/node-ref", f"{base.name}/session_a/lease-1/node-ref.lock",
        f"{base.name}/session_a/lease-1/result-run-1-1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another account makes the folder first")
def test_node_files_are_refused_a_folder_another_account_made_first(node_root):
    taken = node_root / f"gpusession-{os.geteuid()}"
    # (from inside the folder: nobody may not pass through the test's own 0700 folders above it)
    subprocess.run(["mkdir", "-m", "0777", taken.name], cwd=taken.parent, user=65534, check=True)
    with pytest.raises(PermissionError, match=f"another account made {taken} .*an admin removes it"):
        bulk.node_directory("session_a", 1)
    with pytest.raises(PermissionError):
        bulk.result_file(bulk.result_path(rank_spec("session_a", 1, 0)))
    assert os.listdir(taken) == [], "the service wrote into another account's folder"


def test_node_copies_of_leases_no_rank_holds_are_swept_after_a_while_and_the_own_folder_stays(node_root):
    live, gone = lease_files("c1", 1), lease_files("c1", 2)
    old = time.time() - bulk.STALE_AFTER_S - 1
    for lease in (live, gone):
        os.utime(lease, (old, old))
    scratch = {("c1", 1)}  # lease 1 still has its scratch directory (a rank holds it)

    removed = bulk.remove_stale(lambda cluster, lease_id: str(node_root / "scratch")
                                if (cluster, lease_id) not in scratch else str(node_root))
    assert removed == [gone] and os.path.exists(live) and not os.path.exists(gone)
    fresh = lease_files("c1", 3)
    assert bulk.remove_stale(lambda cluster, lease_id: str(node_root / "scratch")) == [live]  # lease 3: too new
    assert os.path.exists(fresh)
    base = f"gpusession-{os.geteuid()}"
    assert [p for p in everything_under(node_root) if "lease-3" not in p] == [base, f"{base}/c1"]


def test_a_leases_node_files_go_with_it_then_the_cluster_folder_and_the_own_folder_stays(node_root):
    first, second = lease_files("c1", 1), lease_files("c1", 2)
    bulk.remove_lease("c1", 1)
    assert not os.path.exists(first) and os.path.exists(second)
    bulk.remove_lease("c1", 2)
    assert everything_under(node_root) == [f"gpusession-{os.geteuid()}"], (
        "what is left of two leases' node files: the account's own folder alone")


def test_data_the_object_store_refuses_is_a_clear_error_naming_its_size_and_what_to_do(monkeypatch):
    """Ray refuses a put when its store (and its spill space) is full: the call fails before any
    GPU is asked for (bulk runs before the lease), saying how big the data was and what to do."""
    import ray

    def full(value):
        raise ray.exceptions.ObjectStoreFullError("the object store is full")

    monkeypatch.setattr(ray, "put", full)
    with pytest.raises(ValueError) as refused:
        bulk.shipment_of(b"header", [bytearray(3 * 10**6)])
    said = str(refused.value)
    assert "(3 MB) do not fit in Ray's object store now (ObjectStoreFullError)" in said, said
    assert "nothing was leased" in said and "--object-store-memory" in said, said
