"""Blocking calls made from plain Python threads of one process (a background run is one)."""
from __future__ import annotations

import threading

import pytest

import gpusession as gs

from ..conftest import take_back_from_a_stuck_caller, wait_for


def _rank_sum(x):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    return float(t.item())


@pytest.mark.slow
def test_blocking_calls_from_plain_threads_more_than_fit_at_once_all_return_their_own_values(cluster):
    """Three calls of 2 GPUs from three threads on 4 GPUs (one waits in the queue), twice in a
    row, with the default console renderer: each returns its own value and every GPU is free
    after (the autouse no_leaked_gpus check)."""
    train = gs.distributed(gpus=2)(_rank_sum)
    results: dict[int, object] = {}

    def call(i):
        try:
            results[i] = train(i)
        except BaseException as exc:  # noqa: BLE001 - the assertion shows it
            results[i] = exc

    for _round in range(2):
        results.clear()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results == {i: 2.0 * i for i in range(3)}, results



def _wait_for_file(path, value):
    import os
    import time

    while not os.path.exists(path):  # the test writes it once the other lease's workers are dead
        time.sleep(0.05)
    return value


def _actor_dead(actor) -> bool:
    import ray

    try:
        ray.get(actor.info.remote(), timeout=5)
        return False
    except ray.exceptions.RayActorError:
        return True


@pytest.mark.slow
def test_a_lease_taken_back_while_it_releases_kills_no_worker_of_another_threads_run(
        cluster, quiet, broker, admin, monkeypatch, tmp_path):
    """Lease A's release waits (as it does for Ray's view of its GPUs) before the broker hears of
    it; meanwhile thread B's run starts, its workers from the process's pool, and the broker takes
    A back by force (an admin's revoke whose grace runs out), killing the worker actors it knows
    as A's. B's run is on none of them: it returns its value. When A's workers went back to the
    pool at the start of its release, B took one and failed with WorkerFailed."""
    from gpusession.broker import client
    from gpusession.cluster import lease as lease_module
    from gpusession.run.background import RunStatus

    held = gs.lease(gpus=1)
    held.run(lambda: None)  # its workers are ready and the broker knows them as A's
    a_actors = [handle.actor for handle in held.crew.handles]
    releasing, go = threading.Event(), threading.Event()
    remove = lease_module.remove_group_and_wait

    def remove_when_told(group, ours, *, lease_id):
        if lease_id == held.lease_id:  # A's only: B's run releases as usual
            releasing.set()
            go.wait(120)
        return remove(group, ours, lease_id=lease_id)

    monkeypatch.setattr(lease_module, "remove_group_and_wait", remove_when_told)
    releaser = threading.Thread(target=held.release)
    releaser.start()
    try:
        assert releasing.wait(60), "A's release never reached its group's removal"
        flag = tmp_path / "a-taken-back"
        run = gs.distributed(gpus=1, max_failures=0)(_wait_for_file).submit(str(flag), 7)
        wait_for(lambda: run.state is RunStatus.RUNNING or run.done(), timeout=120, message="B's run running")
        client.call(broker.revoke, held.lease_id, admin)  # grace 3 s, then the broker kills A's workers
        wait_for(lambda: all(_actor_dead(actor) for actor in a_actors), timeout=30,
                 message="the broker killing A's worker actors after the revoke's grace")
        flag.write_text("A's workers are dead")
        assert run.result(120) == 7
    finally:
        go.set()
        releaser.join(60)
        take_back_from_a_stuck_caller(releaser, broker, admin)
