"""A host lost under a running run spread over 2 hosts: gpusession notices it by its own
heartbeat, names the host and its ranks (never a survivor), and, with max_failures left,
restarts at once where GPUs are free (a 2-rank run moves its lost rank to the other host), goes
on smaller (an elastic run), or fails at once when the hosts that remain could never hold it (a
4-rank run), freeing the survivors' GPUs; no scratch directory is left behind, on the survivor
at once and on the lost host when it starts again. While the host is down the broker's capacity
has left with it: a 4-GPU call waits, ungranted and unbilled, a 2-GPU call runs on the survivor,
and the 4-GPU call runs once the host is back. Bounds are measured from the moment the test
kills the host or cuts its link, with margins for a loaded 2-core machine. A host is killed with
every process frozen first (hostkill.py): stopped with SIGSTOP instead, a Ray worker whose
parent died first was resumed by the kernel, reported its rank's death and cleaned up as a dead
host cannot (under load: one restart too many, no folder left on the killed host)."""
from __future__ import annotations

import json
import os
import queue
import threading
import time
import warnings
from pathlib import Path

import pytest

from .conftest import HERE
from .hostkill import kill_at_once
from .simcluster import SimClusterError, kill_session

pytestmark = pytest.mark.timeout(900)

DEAD_HOST_S = 2.0  # a host whose processes die: noticed within 2 s ...
SILENT_HOST_S = 10.0  # ... one that goes silent within 10 s (5 s by default, GPUSESSION_HOST_SILENCE_S)
FREE_S = 1.0  # the survivors' GPUs free within 1 s of noticing
NEXT_STEP_S = 5.0  # a run moved off a dead host makes its next step within 5 s of the loss
MARGIN_S = 4.0  # a loaded 2-core machine: process starts, GCS calls and the release take longer
RAY_DEAD_AFTER_S = 12.0  # Ray's own verdict on a killed host comes after its health checks fail
PHASES_SLACK_S = 2.0
BROKER_SEES_SILENT_S = 1.5  # the broker probes every node twice a second, each probe bounded by 1 s
SWEPT_WITHIN_S = 10.0  # a host started again: the broker's next reading, then a Ray worker starts there  # the call's time outside its receipt's phases: connecting, and the release's bounded waits
# Under each run, in order: how the host without rank 0 is lost, and how many ranks the run has.
RUNS = (("kill", 4), ("kill", 2), ("cut", 4))


@pytest.fixture(scope="module")
def losses(sim_cluster, tmp_path_factory):
    """One driver on the head, three runs spread over both hosts (node_loss_script.py): under
    the first (4 ranks) the host without rank 0 is killed, and started again once the driver has
    tried the capacity that remains; under the second (2 ranks, one per host) it is killed and
    started again; under the third (4 ranks, elastic) its link is cut. Returns [(the driver's
    RESULT, what the test knows)] for each."""
    cluster = sim_cluster
    cluster.set_resolution("own")
    prefix = str(cluster.base / f"{tmp_path_factory.mktemp('nodeloss').name}-marker")
    proc = cluster.python(cluster.head, str(HERE / "node_loss_script.py"), prefix, str(len(RUNS)))
    out: queue.Queue = queue.Queue()  # read as it comes: a full pipe would stall the driver
    threading.Thread(target=lambda: [out.put(line) for line in proc.stdout] + [out.put("")], daemon=True).start()
    results, lost = [], []
    try:
        for i, (how, ranks) in enumerate(RUNS):
            markers = _wait_markers(proc, out, f"{prefix}-{i}", ranks, timeout=240)
            by_host: dict[str, list[int]] = {}
            for rank, marker in markers.items():
                by_host.setdefault(marker["host"], []).append(rank)
            survivor = cluster.host(markers[0]["host"])
            victim = next(h for h in cluster.workers if h is not survivor)
            lost_at = time.time()
            kill_at_once(victim.netns) if how == "kill" else cluster.cut_link(victim)
            lost.append(victim)
            result = _next_result(proc, out, timeout=180)
            known = {"victim": victim, "survivor": survivor, "lost_at": lost_at, "markers": markers,
                     "victim_ranks": sorted(by_host[victim.name])}
            known["survivor_scratch"] = scratch_dirs(survivor)
            if i == 0:  # the dead host back; and on both hosts what a rank on a dead host leaves
                known["left_by_kill"] = scratch_dirs(victim)
                known["waiting"] = _next_result(proc, out, timeout=180, prefix="WAITING ")
                known["back_at"] = time.time()  # nothing can be granted on it before its processes start
                cluster.restart_host(victim)
                lost.remove(victim)
                known["capacity"] = _next_result(proc, out, timeout=300, prefix="CAPACITY ")
                for host in cluster.workers:
                    scratch_root(host).mkdir(mode=0o700, exist_ok=True)  # (its ranks made it: private)
                    orphan = scratch_root(host) / "session_gone" / "lease-999" / "attempt-0"
                    orphan.mkdir(parents=True, exist_ok=True)
                    (orphan / ".lock").touch()
            elif i + 1 < len(RUNS):
                cluster.restart_host(victim)
                lost.remove(victim)
            Path(f"{prefix}-{i}.go").touch()
            results.append((result, known))
        proc.wait(timeout=60)
        # The host cut last comes back with no work sent to it: what its ranks left (they ran on,
        # silent, until the host was restarted) must go all the same.
        known = results[-1][1]
        known["left_by_cut"] = scratch_dirs(known["victim"])
        try:
            cluster.restart_host(known["victim"])
            lost.remove(known["victim"])
            back = time.monotonic()
            while scratch_dirs(known["victim"]) and time.monotonic() - back < SWEPT_WITHIN_S + MARGIN_S:
                time.sleep(0.2)
            known["left_after_restart"] = scratch_dirs(known["victim"])
        except SimClusterError as exc:
            known["restart_failed"] = str(exc)
    finally:
        kill_session(proc)
        for host in lost:  # leave the cluster whole for whatever runs next, if it comes back
            try:
                cluster.restart_host(host)
            except SimClusterError as exc:  # what the scenarios assert was taken before: warn, not fail
                warnings.warn(f"the simulated host {host.name} did not come back after the scenarios: {exc}")
    return results


def _next_result(proc, out: queue.Queue, timeout: float, prefix: str = "RESULT ") -> dict:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = out.get(timeout=1.0)
        except queue.Empty:
            continue
        if not line:
            pytest.fail("the driver ended without a result:\n" + "".join(seen[-60:]))
        seen.append(line)
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    pytest.fail(f"no {prefix.strip()} line within {timeout:.0f} s:\n" + "".join(seen[-60:]))


def _wait_markers(proc, out: queue.Queue, prefix: str, count: int, timeout: float) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {r: Path(f"{prefix}-rank{r}") for r in range(count)}
        if all(p.exists() and p.stat().st_size for p in found.values()):
            return {r: json.loads(p.read_text()) for r, p in found.items()}
        if proc.poll() is not None:
            pytest.fail(f"the driver ended (exit status {proc.returncode}) before every rank was running; its "
                        "output since the last result:\n" + "".join(_drain(out)[-60:]))
        time.sleep(0.1)
    pytest.fail(f"the ranks were not all running within {timeout:.0f} s")


def _drain(out: queue.Queue) -> list[str]:
    lines = []
    while not out.empty():
        lines.append(out.get_nowait())
    return lines


def assert_blames_the_lost_host(result: dict, known: dict) -> None:
    victim = known["victim"]
    assert result["error_type"] == "WorkerFailed", result
    info = result["run_info"]
    assert info["restarts"] == 0, f"the run restarted before the host was lost: {info['transitions']}"
    message = result["error"]
    ranks = known["victim_ranks"]
    node_id = known["markers"][ranks[0]]["node_id"]  # what the lost ranks themselves ran on
    assert message.startswith(f"Host {victim.name} ({victim.ip}, Ray node {node_id})"), message
    assert f"with ranks {ranks[0]}, {ranks[1]}" in message
    assert result["rank"] in ranks  # never a survivor, though theirs saw "connection closed by peer"
    assert message.endswith("It was not restarted: the hosts that remain have 2 GPUs in all, fewer than the 4 "
                            "the run needs.")  # max_failures=3 left, but no room to restart
    assert result["free_after"][known["survivor"].ip] == 2.0  # the survivor's GPUs, before the error reached us
    assert info["released"] and info["end_reason"] == "failed"


def scratch_root(host) -> Path:
    """The host's scratch folder: its TMPDIR's gpusession-scratch-<uid> (spec.scratch_root)."""
    return host.tmp / f"gpusession-scratch-{os.geteuid()}"


def scratch_dirs(host) -> list[str]:
    root = scratch_root(host)
    return sorted(str(p.relative_to(root)) for p in root.glob("*/lease-*/attempt-*"))


def test_a_host_whose_processes_die_is_named_and_the_survivors_gpus_freed_within_7_s_of_the_kill(losses):
    result, known = losses[0]
    took = result["error_time"] - known["lost_at"]
    assert took < DEAD_HOST_S + FREE_S + MARGIN_S, (
        f"the caller heard of the kill after {took:.2f} s: bound {DEAD_HOST_S} s to notice + {FREE_S} s to free"
        f" + {MARGIN_S} s margin for a loaded 2-core machine")
    assert_blames_the_lost_host(result, known)
    # told by the heartbeat's closed connection, or by Ray's report of the worker, whichever came first
    reasons = ("its processes stopped", "ActorDiedError", "ActorUnavailableError")
    assert any(f"was lost ({reason}" in result["error"] for reason in reasons), result["error"]
    assert known["survivor_scratch"] == []  # the survivor's ranks were stopped and cleaned up


def test_a_run_failed_by_a_lost_host_bills_only_until_its_gpus_were_released_and_its_receipt_adds_up(losses):
    result, known = losses[0]
    ledger = result["ledger"]
    assert ledger["released_at"] <= result["error_time"]  # released before the error reached the caller
    took = ledger["released_at"] - known["lost_at"]
    assert took < DEAD_HOST_S + FREE_S + MARGIN_S, (
        f"released {took:.2f} s after the kill: bound {DEAD_HOST_S} s to notice + {FREE_S} s to free"
        f" + {MARGIN_S} s margin for a loaded 2-core machine")
    assert ledger["gpu_seconds"] == pytest.approx(4 * (ledger["released_at"] - ledger["granted_at"]))
    assert_receipt_adds_up(result, gpus=4)


def test_a_run_that_loses_a_host_restarts_within_7_s_on_the_free_gpu_of_the_host_that_remains(losses):
    result, known = losses[1]
    line = went_on_after_the_loss(result, known, within_s=DEAD_HOST_S + FREE_S + MARGIN_S)  # not Ray's ~15 s
    victim, (rank,) = known["victim"], known["victim_ranks"]
    assert line.startswith(f"host {victim.name} ({victim.ip}, Ray node {known['markers'][rank]['node_id'][:12]}) "
                           f"was lost ("), line
    assert f"with rank {rank}: restarting from the checkpoint after step " in line, line
    assert line.endswith(" (attempt 2 of 4)"), line
    info = result["run_info"]
    assert info["restarts"] == 1 and info["end_reason"] == "finished" and info["released"] and info["gpus"] == 2
    steps = [report["step"] for report in info["history"]]
    assert steps == list(range(len(steps)))  # resumed from its last commit: no step lost, none repeated
    assert all(report["world_size"] == report["total"] == 2 for report in info["history"])
    moved = [report["at"] for report in info["history"] if report["attempt"] == 1]
    assert moved, info["history"]
    assert moved[0] - known["lost_at"] < NEXT_STEP_S + MARGIN_S, (
        f"first step on the survivor {moved[0] - known['lost_at']:.2f} s after the kill: bound {NEXT_STEP_S} s"
        f" + {MARGIN_S} s margin for a loaded 2-core machine")
    survivor = known["markers"][0]["node_id"]  # rank 0's host: both ranks there now, in the broker's books too
    ledger = result["ledger"]
    assert ledger["node_workers"] == {survivor: 2}
    assert list(ledger["gpu_ids"]) == [survivor] and len({ids[0] for ids in ledger["gpu_ids"][survivor]}) == 2
    # 2 GPUs billed throughout: the lost host's share ended where the new one began
    assert ledger["gpu_seconds"] == pytest.approx(2 * (ledger["released_at"] - ledger["granted_at"]))
    assert_receipt_adds_up(result, gpus=2)


def went_on_after_the_loss(result: dict, known: dict, *, within_s: float) -> str:
    """The run finished with 2 ranks on the host that remained, its restarted attempt making 10
    steps from its last commit, and told its one restart line within `within_s` of the loss:
    returns the line."""
    assert "error_type" not in result, result.get("error")
    value = result["value"]  # the restarted attempt's own account
    told = result["transitions"]  # (time, line) of each restart: what a second one was for
    assert value["world_size"] == 2 and value["attempt"] == 1 and value["step"] == value["resumed_at"] + 10, \
        f"{value}; restarts:\n" + "\n".join(f"{at - known['lost_at']:.2f} s after the loss: {line}" for at, line in told)
    (told_at, line), = told
    assert told_at - known["lost_at"] < within_s, (
        f"restart line {told_at - known['lost_at']:.2f} s after the loss: bound {within_s} s"
        f" (including {MARGIN_S} s margin for a loaded 2-core machine)")
    return line


def assert_receipt_adds_up(result: dict, *, gpus: int) -> None:
    """The receipt's phases are the call's time, and it bills no more than its GPUs while held."""
    info = result["run_info"]
    phases = info["queued_s"] + info["setup_s"] + info["run_s"]
    assert 0 <= result["wall_s"] - phases < PHASES_SLACK_S, (result["wall_s"], info)
    assert gpus * info["run_s"] <= info["gpu_seconds"] <= gpus * (result["wall_s"] - info["queued_s"]), info


def test_an_elastic_run_goes_on_with_the_host_that_remains_when_one_goes_silent(losses):
    result, known = losses[2]
    line = went_on_after_the_loss(result, known, within_s=SILENT_HOST_S + FREE_S + MARGIN_S)
    victim, ranks = known["victim"], known["victim_ranks"]
    node_id = known["markers"][ranks[0]]["node_id"]
    assert line.startswith(f"host {victim.name} ({victim.ip}, Ray node {node_id[:12]}) was lost (silent for "), line
    assert f"with ranks {ranks[0]}, {ranks[1]}: restarting from the checkpoint after step " in line
    assert line.endswith(" on 2 GPUs (attempt 2 of 4)"), line
    info = result["run_info"]
    assert info["restarts"] == 1 and info["end_reason"] == "finished" and info["released"] and info["gpus"] == 2
    steps = [report["step"] for report in info["history"]]
    assert steps == list(range(len(steps)))  # resumed from its last commit: no step lost, none repeated
    sizes = [report["world_size"] for report in info["history"]]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 4 and sizes[-1] == 2
    assert all(report["total"] == report["world_size"] for report in info["history"])
    assert result["free_after"][known["survivor"].ip] == 2.0
    assert known["survivor_scratch"] == []


def test_a_silent_hosts_gpus_leave_the_brokers_capacity_within_5_5_s_of_the_cut(losses):
    result, known = losses[2]
    took = result["lost_in_capacity_at"] - known["lost_at"]
    assert took < BROKER_SEES_SILENT_S + MARGIN_S, (
        f"out of the capacity {took:.2f} s after the cut: bound {BROKER_SEES_SILENT_S} s (two probes a second,"
        f" each bounded by 1 s) + {MARGIN_S} s margin for a loaded 2-core machine")


def test_a_host_started_again_sweeps_what_its_lost_ranks_left_with_no_work_sent_to_it(losses):
    known = losses[2][1]
    assert "restart_failed" not in known, known.get("restart_failed")
    assert known["left_by_cut"]  # the silent host's ranks held their scratch directories until it restarted
    assert known["left_after_restart"] == []  # the broker swept them when the host joined again


def test_workers_sweep_what_lost_ranks_left(losses):
    known = losses[2][1]
    # Every directory no live rank held when this run's workers started was swept: the orphans,
    # and what the ranks of the host killed in the first run left (its directories were still
    # there when it started again).
    first_victim, left_by_kill = losses[0][1]["victim"], losses[0][1]["left_by_kill"]
    assert left_by_kill  # the killed host's ranks could not clean up ...
    assert not set(left_by_kill) & set(scratch_dirs(first_victim))  # ... its workers did when it was back
    assert not [d for h in (known["victim"], known["survivor"]) for d in scratch_dirs(h) if "lease-999" in d]


def test_the_lost_hosts_gpus_leave_the_brokers_capacity_before_ray_calls_it_dead(losses):
    _, known = losses[0]
    waiting = known["waiting"]
    assert waiting["view_when_lost"] == {"gpus_total": 4.0, "gpus_free": 2.0, "gpus_lost": 2.0, "gpus_unmanaged": 0.0}
    took = waiting["lost_seen_at"] - known["lost_at"]
    assert took < DEAD_HOST_S + MARGIN_S, (
        f"the broker saw the loss {took:.2f} s after the kill: bound {DEAD_HOST_S} s + {MARGIN_S} s margin"
        " for a loaded 2-core machine")
    if waiting["lost_seen_at"] - known["lost_at"] < RAY_DEAD_AFTER_S:
        assert waiting["ray_alive_gpu_nodes_then"] == 2  # Ray still listed the host: the broker did not wait for that


def test_while_the_host_is_down_a_4_gpu_call_waits_ungranted_and_a_2_gpu_call_runs_on_the_survivor(losses):
    _, known = losses[0]
    waiting = known["waiting"]
    assert waiting["four_first_seen"] == {"state": "queued", "wait_kind": "capacity"}
    assert waiting["four_states_while_lost"] == ["queued"]
    assert waiting["two_gpu_nodes"] == [known["markers"][0]["node_id"]]  # rank 0's host survived


def test_the_4_gpu_call_runs_once_the_host_is_back_and_nothing_unplaced_is_billed(losses):
    _, known = losses[0]
    capacity = known["capacity"]
    four = capacity["four"]
    assert "error" not in four, four
    assert len(four["nodes"]) == 2 and known["markers"][0]["node_id"] in four["nodes"]
    assert four["gpu_seconds"] <= 4 * (four["done"] - known["back_at"])  # billed from its grant, after the host was back
    assert capacity["billed_unplaced"] == 0
    assert all(row["state"] == "ended" for row in capacity["rows"])
    assert all(row["gpu_seconds"] > 0 for row in capacity["rows"] if row["placed"])
