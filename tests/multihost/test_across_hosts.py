"""Ranks on two simulated hosts meet and train, whatever each host's own name resolves to; a run
that fails on one host leaves no scratch directory on either."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_driver
from .simcluster import INNER_IF

# the first test also waits for the shared cluster (~30 s here, up to a few minutes when loaded)
pytestmark = pytest.mark.timeout(900)

def known_sum(world_size: int) -> float:
    return world_size * (world_size + 1) / 2  # all_reduce of rank + 1


def known_weight(world_size: int) -> float:
    return 1.0 - 0.1 * known_sum(world_size) / world_size  # one SGD step on the averaged gradient


def by_host(ranks: list[dict]) -> dict[str, list[int]]:
    hosts: dict[str, list[int]] = {}
    for r in ranks:
        hosts.setdefault(r["host"], []).append(r["rank"])
    return hosts


def assert_trained_on_two_hosts(result: dict, cluster) -> None:
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == list(range(len(ranks)))
    assert set(by_host(ranks)) == {"host1", "host2"}, by_host(ranks)
    n = len(ranks)
    assert {r["allreduce"] for r in ranks} == {known_sum(n)}
    assert [r["weight"] for r in ranks] == pytest.approx([known_weight(n)] * n)
    rank0_ip = cluster.host(ranks[0]["host"]).ip
    assert {r["master_addr"] for r in ranks} == {rank0_ip}  # rank 0's Ray node IP
    for r in ranks:
        assert r["node_ip"] == cluster.host(r["host"]).ip
    assert result["free_gpus_after"] == 4.0


@pytest.fixture
def own_addresses(sim_cluster):
    sim_cluster.set_resolution("own")
    return sim_cluster


@pytest.fixture
def loopback_names(sim_cluster):
    sim_cluster.set_resolution("loopback")
    yield sim_cluster
    sim_cluster.set_resolution("own")


def test_spread_run_trains_on_two_hosts_with_torchrun_ranks_per_host(own_addresses):
    result = run_driver(own_addresses, "train_script.py", "spread")
    assert_trained_on_two_hosts(result, own_addresses)
    assert sorted(by_host(result["ranks"]).values()) == [[0, 1], [2, 3]]  # contiguous per host
    assert {r["gloo_ifname"] for r in result["ranks"]} == {INNER_IF}
    first, second = (result["ranks"][r]["host"] for r in (0, 2))
    where = (f"ranks 0-1 on {first} ({own_addresses.host(first).ip}), "
             f"2-3 on {second} ({own_addresses.host(second).ip})")
    assert f" · {where} · released" in result["receipt"]  # the receipt names each host's ranks


def test_strict_spread_puts_one_two_gpu_worker_on_each_host(own_addresses):
    result = run_driver(own_addresses, "train_script.py", "strict_spread")
    assert len(result["ranks"]) == 2 and {r["gpus_seen"] for r in result["ranks"]} == {2}
    assert_trained_on_two_hosts(result, own_addresses)


def test_hosts_whose_own_name_resolves_to_127_0_1_1_still_train_together(loopback_names):
    result = run_driver(loopback_names, "train_script.py", "spread", "--keep-nccl-ifname", "^docker")
    assert {r["host_resolves_to"] for r in result["ranks"]} == {"127.0.1.1"}  # the Debian default
    assert_trained_on_two_hosts(result, loopback_names)
    assert {r["gloo_ifname"] for r in result["ranks"]} == {INNER_IF}
    assert {r["nccl_ifname"] for r in result["ranks"]} == {"^docker"}  # the user's own value is kept


def test_a_run_that_fails_on_one_host_leaves_no_scratch_directory_on_either_host(own_addresses):
    result = run_driver(own_addresses, "train_script.py", "spread", "--fail-on-rank", "3")
    assert result["error_type"] == "WorkerFailed" and "planned failure on rank 3" in result["error"], result
    lease = result["lease_id"]
    used = {host.name: [Path(p.read_text()) for p in host.tmp.glob(f"scratch-of-lease{lease}-rank*")]
            for host in own_addresses.workers}
    assert sorted(len(dirs) for dirs in used.values()) == [2, 2]  # both hosts' ranks wrote to theirs
    assert [d for dirs in used.values() for d in dirs if d.exists()] == []  # removed before the call raised
    assert result["free_gpus_after"] == 4.0
