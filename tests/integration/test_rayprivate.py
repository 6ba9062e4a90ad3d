"""Each private Ray API gpusession relies on, called against the installed Ray on the session's
cluster: when a Ray upgrade moves one, this names the call instead of a broker that silently
cannot see free GPUs or dead drivers."""
from __future__ import annotations

import logging
import os

import ray

import gpusession
from gpusession.cluster import rayprivate

from ..conftest import CLUSTER_GPUS


def test_per_node_resources_show_the_clusters_gpus(cluster):
    node_id = ray.get_runtime_context().get_node_id()
    assert rayprivate.total_resources_per_node()[node_id]["GPU"] == CLUSTER_GPUS
    assert 0 <= rayprivate.available_resources_per_node()[node_id].get("GPU", 0.0) <= CLUSTER_GPUS


def test_the_job_table_lists_this_driver_as_running(cluster):
    mine = ray.get_runtime_context().get_job_id()
    rows = {row["JobID"]: row for row in rayprivate.jobs()}
    assert mine in rows and not rows[mine]["EndTime"] and not rows[mine]["IsDead"]


def test_node_address_session_dir_and_accelerators(cluster):
    node_ip = ray.nodes()[0]["NodeManagerAddress"]
    assert rayprivate.node_ip_address() == node_ip
    assert os.path.isdir(os.path.join(rayprivate.session_dir(), "logs"))
    assert rayprivate.accelerator_count("GPU") == 0  # this machine has no GPU; Ray's NVML probe says so
    rayprivate.refresh_auth_config()  # raises if Ray moved its auth config


def test_the_package_uploads_as_a_gcs_module(cluster):
    env = rayprivate.upload_package(gpusession.__path__[0], logging.getLogger("test"))
    assert [uri.startswith("gcs://") for uri in env["py_modules"]] == [True]


def test_the_clusters_key_value_store_keeps_a_record(cluster):
    assert rayprivate.kv_get("never-written", namespace="gpusession-test") is None
    rayprivate.kv_put("record", b"one", namespace="gpusession-test")
    rayprivate.kv_put("record", b"two", namespace="gpusession-test")  # overwrites
    assert rayprivate.kv_get("record", namespace="gpusession-test") == b"two"


def test_every_node_carries_its_id_as_the_label_a_group_can_avoid(cluster):
    """Not private, but relied on the same way: a group re-made after a host was lost excludes
    that host with a bundle label selector on this label (run/caller/lease.py)."""
    from gpusession.cluster.raycluster import NODE_ID_LABEL

    assert all(node["Labels"].get(NODE_ID_LABEL) == node["NodeID"] for node in ray.nodes() if node["Alive"])


def test_a_driver_knows_whether_it_started_its_clusters_head(cluster, driver):
    """This test process started the session's head (the embedded cluster ends with it); a driver
    that joined it by address did not (a user's own gateway may outlive it)."""
    assert rayprivate.head_started_here() is True
    joined = driver("""
        import ray
        from gpusession.cluster import rayprivate
        ray.init(logging_level="ERROR")
        print("STARTED", rayprivate.head_started_here(), flush=True)
    """)
    assert joined.wait_for_line("STARTED ", timeout=120) == "STARTED False"
