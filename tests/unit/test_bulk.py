"""Big arguments out of band (run/bulk.py): arrays and CPU tensors leave the pickle as buffers and
come back equal, over a node file mapped copy-on-write; small ones stay inside the pickle."""
from __future__ import annotations

import os
import time

import cloudpickle
import numpy
import pytest
import torch

from gpusession.run import bulk
from gpusession.run.shipping import dumps_with_buffers

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


def test_node_copies_of_leases_no_rank_holds_are_swept_after_a_while(tmp_path, monkeypatch):
    monkeypatch.setattr(bulk, "NODE_ROOT", str(tmp_path))
    live, gone = tmp_path / "gpusession-c1" / "lease-1", tmp_path / "gpusession-c1" / "lease-2"
    for lease in (live, gone):
        lease.mkdir(parents=True)
        (lease / "copy").write_bytes(b"x")
        old = time.time() - bulk.STALE_AFTER_S - 1
        os.utime(lease, (old, old))
    scratch = {("c1", 1)}  # lease 1 still has its scratch directory (a rank holds it)

    removed = bulk.remove_stale(lambda cluster, lease_id: str(tmp_path / "scratch") if (cluster, lease_id) not in scratch
                                else str(tmp_path))
    assert removed == [str(gone)] and live.exists() and not gone.exists()
    fresh = tmp_path / "gpusession-c1" / "lease-3"
    fresh.mkdir()
    assert bulk.remove_stale(lambda cluster, lease_id: str(tmp_path / "scratch")) == [str(live)]  # lease 3: too new
    assert fresh.exists()


def test_a_leases_node_files_go_with_it_and_the_cluster_folder_once_no_lease_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(bulk, "NODE_ROOT", str(tmp_path))
    first, second = bulk.node_directory("c1", 1), bulk.node_directory("c1", 2)
    for lease in (first, second):
        os.makedirs(lease)
        with open(os.path.join(lease, "copy"), "wb") as out:
            out.write(b"x")
    bulk.remove_lease("c1", 1)
    assert not os.path.exists(first) and os.path.exists(second)
    bulk.remove_lease("c1", 2)
    assert not os.path.exists(os.path.dirname(second)), "the cluster's folder outlived its last lease"



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
