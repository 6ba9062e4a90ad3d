"""A host lost under a running 4-rank run (2 ranks on each of 2 hosts): gpusession notices it
by its own heartbeat, names the host and its ranks (never a survivor), frees the survivors'
GPUs, and leaves no scratch directory behind, on the survivor at once and on the lost host
when it starts again. Bounds are measured from the moment the test kills the host or cuts its
link, with margins for a loaded 2-core machine."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .conftest import HERE
from .simcluster import kill_session

pytestmark = pytest.mark.timeout(900)

DEAD_HOST_S = 2.0  # a host whose processes die: noticed within 2 s ...
SILENT_HOST_S = 10.0  # ... one that goes silent within 10 s (5 s by default, GPUSESSION_HOST_SILENCE_S)
FREE_S = 1.0  # the survivors' GPUs free within 1 s of noticing
MARGIN_S = 4.0  # a loaded 2-core machine: process starts, GCS calls and the release take longer


def run_until_lost(cluster, tmp_path: Path, lose) -> tuple[dict, dict]:
    """Start the run, wait until every rank is in its stride, lose the host without rank 0 by
    `lose(host)`; returns (the driver's RESULT, what the test knows: victim, survivor, when)."""
    prefix = str(cluster.base / f"{tmp_path.name}-marker")
    proc = cluster.python(cluster.head, str(HERE / "node_loss_script.py"), prefix)
    try:
        markers = _wait_markers(proc, prefix, 4, timeout=240)
        by_host: dict[str, list[int]] = {}
        for rank, marker in markers.items():
            by_host.setdefault(marker["host"], []).append(rank)
        survivor = cluster.host(markers[0]["host"])
        victim = next(h for h in cluster.workers if h is not survivor)
        lost_at = time.time()
        lose(victim)
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_session(proc)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-4000:]
    known = {"victim": victim, "survivor": survivor, "lost_at": lost_at, "markers": markers,
             "victim_ranks": sorted(by_host[victim.name]), "survivor_ranks": sorted(by_host[survivor.name])}
    return json.loads(lines[-1][len("RESULT "):]), known


def _wait_markers(proc, prefix: str, count: int, timeout: float) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {r: Path(f"{prefix}-rank{r}") for r in range(count)}
        if all(p.exists() and p.stat().st_size for p in found.values()):
            return {r: json.loads(p.read_text()) for r, p in found.items()}
        if proc.poll() is not None:
            pytest.fail(f"the run ended before every rank was running:\n{proc.communicate()[0][-4000:]}")
        time.sleep(0.1)
    pytest.fail(f"the ranks were not all running within {timeout:.0f} s")


def assert_blames_the_lost_host(result: dict, known: dict) -> None:
    victim = known["victim"]
    assert result["error_type"] == "WorkerFailed", result
    message = result["error"]
    ranks = known["victim_ranks"]
    assert message.startswith(f"Host {victim.name} ({victim.ip}, Ray node {result['node_ids'][victim.ip]})"), message
    assert f"with ranks {ranks[0]}, {ranks[1]}" in message
    assert result["rank"] in ranks  # never a survivor, though theirs saw "connection closed by peer"
    assert message.endswith("It was not restarted: the hosts that remain have 2 GPUs in all, fewer than the 4 "
                            "the run needs.")  # max_failures=3 left, but no room to restart
    assert result["free_after"][known["survivor"].ip] == 2.0  # the survivor's GPUs, before the error reached us
    info = result["run_info"]
    assert info["released"] and info["end_reason"] == "failed" and info["restarts"] == 0


def scratch_dirs(host) -> list[str]:
    root = host.tmp / "gpusession-scratch"
    return sorted(str(p.relative_to(root)) for p in root.glob("*/lease-*/attempt-*"))


@pytest.fixture
def whole_cluster(sim_cluster):
    """Each scenario starts with both hosts up; a host lost by one comes back for the next."""
    sim_cluster.set_resolution("own")
    yield sim_cluster
    for host in sim_cluster.workers:
        if getattr(host, "lost", False):
            sim_cluster.restart_host(host)
            host.lost = False


def test_a_host_whose_processes_die_is_named_within_2_s_and_the_survivors_gpus_are_free(whole_cluster, tmp_path):
    def kill(host):
        host.lost = True
        whole_cluster.kill_host(host)

    result, known = run_until_lost(whole_cluster, tmp_path, kill)
    assert result["error_time"] - known["lost_at"] < DEAD_HOST_S + FREE_S + MARGIN_S
    assert_blames_the_lost_host(result, known)
    assert "its processes stopped" in result["error"]
    assert scratch_dirs(known["survivor"]) == []  # the survivor's ranks were stopped and cleaned up
    assert scratch_dirs(known["victim"]) != []  # the dead host could not clean up: swept when it is back


def test_a_host_gone_silent_is_named_within_10_s_and_workers_sweep_what_lost_ranks_left(whole_cluster, tmp_path):
    for host in whole_cluster.workers:  # what a rank on a host that died leaves: a directory nobody holds
        orphan = host.tmp / "gpusession-scratch" / "session_gone" / "lease-999" / "attempt-0"
        orphan.mkdir(parents=True, exist_ok=True)
        (orphan / ".lock").touch()

    def cut(host):
        host.lost = True
        whole_cluster.cut_link(host)

    result, known = run_until_lost(whole_cluster, tmp_path, cut)
    assert result["error_time"] - known["lost_at"] < SILENT_HOST_S + FREE_S + MARGIN_S
    assert_blames_the_lost_host(result, known)
    assert "silent for" in result["error"]
    assert scratch_dirs(known["survivor"]) == []
    # The workers of this run swept every directory no live rank held when they started: the
    # orphans, and what the host killed by the previous scenario left before it started again.
    this_lease = f"lease-{known['markers'][0]['lease_id']}"
    assert [d for d in scratch_dirs(known["victim"]) if d.split("/")[1] != this_lease] == []
