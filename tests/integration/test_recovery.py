"""A run survives its workers: faults restart the attempt from the last checkpoint, user errors
fail fast, and a survivor blocked in a collective is never left hanging."""
from __future__ import annotations

import os
import signal
import time

import pytest

import gpusession as gs

from ..conftest import CLUSTER_GPUS, free_gpus
from .recovery_train import train

DETECT_AND_STEP_MARGIN_S = 15.0  # target 5 s from the kill to the next step; loaded CI machines are slower


def test_a_rank_killed_mid_run_restarts_from_its_checkpoint_and_ends_with_uninterrupted_weights(
        cluster, quiet, tmp_path):
    import torch

    marker = str(tmp_path / "killed")
    run = gs.distributed(gpus=2)(train)
    expected = run()
    resumed = run(kill_rank=1, kill_at_step=5, marker=marker)

    info = run.last_run
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)
    assert info.restarts == 1 and info.end_reason == "finished" and info.steps_lost == 0
    assert [r["step"] for r in info.history] == list(range(12))  # none repeated, none lost
    assert [r["attempt"] for r in info.history] == [0] * 6 + [1] * 6
    line = info.transitions[0]
    assert line.startswith("rank 1 died on ") and "(SIGKILL)" in line
    assert "restarting from the checkpoint after step 5 (attempt 2 of 4)" in line
    killed_at = float(open(marker).read())
    first_step_after = info.history[6]["at"]
    assert first_step_after - killed_at < DETECT_AND_STEP_MARGIN_S
    assert free_gpus() == CLUSTER_GPUS


def test_a_killed_worker_actor_on_a_host_that_answers_is_one_workers_loss_and_the_run_restarts(
        cluster, quiet, tmp_path):
    """The worker actor that relays rank 1 is killed (its host lives on): judged a lost worker, not
    a lost host, after the host has been asked again, and the run goes on from its checkpoint."""
    import threading

    import ray

    marker = str(tmp_path / "held")
    killed: list[float] = []
    with gs.lease(gpus=2) as lease:
        def kill_rank_1s_worker() -> None:
            deadline = time.monotonic() + 120
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
            killed.append(time.time())
            ray.kill(lease.crew.handles[1].actor)

        killer = threading.Thread(target=kill_rank_1s_worker, daemon=True)
        killer.start()
        lease.run(train, hold_at_step=5, marker=marker)
        killer.join()
    info = lease.info
    assert info.restarts == 1 and info.end_reason == "finished" and info.steps_lost == 0
    assert [r["step"] for r in info.history] == list(range(12))
    line = info.transitions[0]
    assert line.startswith("rank 1 was lost on ") and "restarting from the checkpoint after step 5" in line, line
    assert info.history[6]["at"] - killed[0] < DETECT_AND_STEP_MARGIN_S
    assert free_gpus() == CLUSTER_GPUS


def test_an_exception_in_user_code_fails_fast_without_a_retry(cluster, quiet):
    @gs.distributed(gpus=2)  # max_failures=3, but a bug is not a fault
    def bug():
        import torch
        import torch.distributed as dist

        if gs.context().rank == 1:
            raise ValueError(f"bad learning rate at {time.time()!r}")
        dist.all_reduce(torch.ones(1))  # rank 0 waits for a peer that never comes

    with pytest.raises(gs.WorkerFailed) as failure:
        bug()
    caught = time.time()
    raised = float(failure.value.remote_message.rsplit(" ", 1)[-1])
    assert failure.value.rank == 1 and failure.value.remote_type == "ValueError"
    assert caught - raised < 2.0 + 3.0  # target 2 s; 3 s of margin for a loaded machine
    assert bug.last_run.restarts == 0 and bug.last_run.end_reason == "failed"


def test_retry_exceptions_retries_the_named_exception_types(cluster, quiet, tmp_path):
    flag = str(tmp_path / "failed-once")

    @gs.distributed(gpus=2, retry_exceptions=(TimeoutError,))
    def flaky_io(flag):
        if gs.context().rank == 0 and not os.path.exists(flag):
            open(flag, "w").close()
            raise TimeoutError("the data server did not answer")
        return gs.context().attempt

    assert flaky_io(flag) == 1
    assert flaky_io.last_run.restarts == 1
    assert "TimeoutError" in flaky_io.last_run.transitions[0]


def test_a_survivor_blocked_in_a_collective_is_torn_down_when_its_peer_dies(cluster, quiet):
    @gs.distributed(gpus=2, max_failures=0, return_all=True)
    def peer_dies():
        import torch
        import torch.distributed as dist

        if gs.context().rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))  # rank 0 blocks here; its peer never arrives

    started = time.monotonic()
    with pytest.raises(gs.WorkerFailed) as failure:
        peer_dies()
    assert time.monotonic() - started < 30  # seconds, not gloo's 30-minute timeout
    assert failure.value.rank == 1 and "SIGKILL" in str(failure.value)  # the dead rank, never the survivor
    assert free_gpus() == CLUSTER_GPUS


def test_nothing_a_call_changes_in_its_processes_reaches_the_next_call(cluster, quiet, tmp_path):
    @gs.distributed(gpus=2, return_all=True)
    def change_everything(directory, mixed_precision):
        import json

        import torch
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, PartialState

        before = {"threads": torch.get_num_threads(), "env": os.environ.get("GS_TEST_LEAK"),
                  "cwd": os.getcwd(), "global": getattr(json, "_gs_leak", None),
                  "accelerate": sorted(AcceleratorState._shared_state) + sorted(PartialState._shared_state)}
        torch.set_num_threads(1)
        os.environ["GS_TEST_LEAK"] = "leaked"
        os.chdir(directory)
        json._gs_leak = "leaked"  # a module global of a library
        # Accelerate's state is a process-wide singleton: in a process that outlived call 1, call
        # 2's Accelerator() would silently get call 1's bf16 (the bug this guards against).
        accelerator = Accelerator() if mixed_precision is None else Accelerator(mixed_precision=mixed_precision)
        return before, accelerator.mixed_precision

    first = change_everything(str(tmp_path), "bf16")
    second = change_everything(str(tmp_path), None)
    assert [before for before, _ in second] == [before for before, _ in first]
    assert [precision for _, precision in first] == ["bf16", "bf16"]
    assert [precision for _, precision in second] == ["no", "no"]
    assert all(b["env"] is None and b["global"] is None and b["accelerate"] == [] for b, _ in second)
    assert all(b["cwd"] != str(tmp_path) for b, _ in second)
