"""Several Ray nodes (ray.cluster_utils.Cluster on one machine): ranks grouped per node like
torchrun, per-node GPU visibility, and placement judged per node by the broker."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts its own multi-node Ray cluster (ray.cluster_utils)

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("multinode") / "report.json"
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, str(HERE / "multinode_script.py"), str(out)], env=env,
                            capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_spread_lease_puts_two_workers_on_each_node_with_torchrun_ranks(report):
    ranks = report["spread"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world_size"] for r in ranks} == {4}
    by_node: dict[str, list] = {}
    for r in ranks:
        by_node.setdefault(r["node"], []).append(r)
    assert len(by_node) == 2
    for members in by_node.values():
        assert sorted(m["local_rank"] for m in members) == [0, 1]
        assert {m["local_world_size"] for m in members} == {2}
        assert len({m["node_rank"] for m in members}) == 1
        assert len({m["visible"] for m in members}) == 1 and len(members[0]["visible"].split(",")) == 2
    assert ranks[0]["node_rank"] == 0 and ranks[1]["node_rank"] == 0  # contiguous ranks per node


def test_a_spread_call_and_its_repeat_fork_every_rank_from_its_nodes_warm_parent(report):
    first, repeat = report["spread_parents"]
    zygotes = report["node_zygotes"]
    assert len({node for node, _ in first}) == 2
    assert all(parent == zygotes[node] for node, parent in first + repeat)


def test_allreduce_works_across_nodes(report):
    assert report["allreduce_across_nodes"] == 4.0


def test_strict_pack_is_judged_per_node(report):
    # 3 GPUs on one node of two 2-GPU nodes: refused by the largest node, not by the cluster's 4
    assert "Needs 3 GPUs" in report["strict_pack_3"]
    assert "on one node (strict_pack) but the largest node has 2 GPUs" in report["strict_pack_3"]
    same_node = report["strict_pack_2"]
    assert len({r["node"] for r in same_node}) == 1


def test_every_gpu_is_free_after_the_calls(report):
    assert report["free_after"] == 4.0


def test_a_run_whose_node_is_removed_finishes_on_the_other_node_with_uninterrupted_weights(report):
    """The lost node held rank 0 and its last checkpoint (4 MB, too large for Ray to inline): the
    run resumes from that checkpoint, the caller's own copy, losing no step."""
    loss = report["node_loss"]
    assert loss["node_removed"] and loss["same_weights"]
    assert loss["restarts"] == 1 and loss["steps"] == list(range(12)) and loss["steps_lost"] == 0
    assert loss["attempts"] == [0] * 6 + [1] * 6  # step 5 was not done again
    line = loss["transitions"][0]
    assert line.startswith("host ") and f"Ray node {loss['removed_node'][:12]}) was lost" in line  # by its heartbeat
    assert "with ranks 0, 1: restarting from the checkpoint after step 5 (attempt 2 of 4)" in line
    assert loss["free_after"] == 2.0  # the lost node's GPUs are gone; the survivor's are free


def test_a_node_hosts_socket_folder_is_held_while_it_lives_and_swept_once_ray_ends_it(report):
    """A host Ray ends (its node removed, the cluster shut down) cannot remove its folder; its
    lock goes with its process, and the next sweep (a host starting) removes the folder. A stale
    folder left long ago is gone once this cluster's first host started."""
    found = report["warm_dirs"]
    assert found["planted_gone"]
    assert found["swept_while_hosts_live"] == [] and found["live"] == [True, True]
    assert found["lost_node_left"] and found["lost_node_swept"]
    assert found["after_cluster_swept"]
