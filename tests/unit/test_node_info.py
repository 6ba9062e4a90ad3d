"""How gpusession reads a Ray node's GPUs: real when Ray found an accelerator, logical when it did
not, or when the node carries gpusession's logical-GPUs marker (the test suite's session cluster)."""
from __future__ import annotations

from gpusession.cluster.raycluster import HEAD_RESOURCE, LOGICAL_GPUS_RESOURCE, node_info


def node(**resources) -> dict:
    return {"NodeID": "n1", "NodeManagerAddress": "192.0.2.2", "NodeManagerPort": 1234, "Alive": True,
            "Resources": {"CPU": 4.0, **resources}}


def test_gpus_ray_declared_without_an_accelerator_are_logical():
    info = node_info(node(GPU=4.0, **{HEAD_RESOURCE: 1.0}))
    assert info.logical and info.gpus == 4.0 and info.is_head and info.raylet_port == 1234


def test_gpus_with_an_accelerator_behind_them_are_real():
    assert not node_info(node(GPU=1.0, **{"accelerator_type:H200": 1.0})).logical


def test_the_logical_marker_makes_a_gpu_machines_gpus_logical():
    assert node_info(node(GPU=4.0, **{"accelerator_type:H200": 1.0, LOGICAL_GPUS_RESOURCE: 1.0})).logical


def test_a_node_without_gpus_is_not_logical():
    assert not node_info(node()).logical
