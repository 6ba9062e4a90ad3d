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
    row, with the default console renderer: each returns its own value, each thread's
    `train.last_run` is its own call's (not whichever started last), and every GPU is free
    after (the autouse no_leaked_gpus check)."""
    train = gs.distributed(gpus=2)(_rank_sum)
    results: dict[int, object] = {}
    seen: dict[int, object] = {}

    def call(i):
        try:
            results[i] = train(i)
        except BaseException as exc:  # noqa: BLE001 - the assertion shows it
            results[i] = exc
        seen[i] = train.last_run

    for _round in range(2):
        results.clear()
        seen.clear()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results == {i: 2.0 * i for i in range(3)}, results
        assert len({id(info) for info in seen.values()}) == 3, "threads saw one another's last_run"
        assert all(info.end_reason == "finished" for info in seen.values())



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
    from gpusession.run.caller import lease as lease_module
    from gpusession.api.background import RunStatus

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


def _waits_for_file(path, value):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return value


@pytest.fixture
def broker_on_a_chosen_ledger(cluster, tmp_path):
    """The session's broker swapped for one started on an explicit ledger elsewhere (as `gpusession
    hub` and a Jupyter server with c.GPUSession.db_path start theirs); afterwards the session's
    broker as conftest started it, on the session's ledger again."""
    import ray

    from gpusession.broker import client
    from gpusession.broker.service.settings import BrokerConfig

    session = dict(preemption_grace_s=3.0, revoke_grace_s=3.0, heartbeat_timeout_s=3.0, claim_timeout_s=10.0)

    def replace(config: BrokerConfig):
        try:
            ray.kill(ray.get_actor(client.BROKER_NAME, namespace=client.NAMESPACE), no_restart=True)
        except ValueError:
            pass
        client._wait_until_gone()
        client.forget()
        handle = client.broker(config)
        client.call(handle.info)
        return handle

    chosen = tmp_path / "hub-state" / "ledger.db"
    chosen.parent.mkdir()
    yield replace(BrokerConfig(db_path=str(chosen), **session)), chosen
    replace(BrokerConfig(db_path=str(cluster.db_path), **session))


@pytest.mark.slow
def test_calls_of_plain_threads_go_on_when_their_broker_is_killed_for_good_and_a_thread_starts_one(
        cluster, quiet, broker_on_a_chosen_ledger, tmp_path):
    """Two threads' calls run on leases of a broker started on an explicit ledger. That broker is
    killed for good (as when an admin's newer client replaces it, before its new one is up); the
    calls' watches fail, and the first thread to look the broker up again starts one with the
    default settings. Both calls return their values, and the broker answering now keeps the
    ledger they were granted in: both leases end there as finished. Before, the new broker opened
    the default directory's ledger, where the calls' lease ids were unknown (LeaseNotFound from
    the watch, or another lease of that ledger under the same id)."""
    import ray

    from gpusession.broker import client

    first, chosen = broker_on_a_chosen_ledger
    admin = {"token": (chosen.parent / "admin_token").read_text().strip(), "user": "admin"}
    gate = tmp_path / "gate"
    train = gs.distributed(gpus=1, max_failures=0)(_waits_for_file)
    results: dict[int, object] = {}

    def call(i):
        try:
            results[i] = train(str(gate), i)
        except BaseException as exc:  # noqa: BLE001 - the assertion shows it
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len([r for r in client.call(first.leases, admin) if r["state"] == "placed"]) == 2
                 or results, timeout=120, message="both calls' leases placed")
        leases = [r["lease_id"] for r in client.call(first.leases, admin)]
        ray.kill(first, no_restart=True)  # gone for good: the calls' watches fail at once
        # A broker started afresh under load takes a minute and more (seen: 61 s at load 16-34).
        wait_for(lambda: _named_broker_answers(client), timeout=client._START_TIMEOUT_S,
                 message="a thread starting a broker again after its watch failed")
    finally:
        gate.touch()
        for t in threads:
            t.join(120)
    assert results == {0: 0, 1: 1}, results
    now = client.broker()
    assert client.call(now.info, admin)["db_path"] == str(chosen)
    ended = {r["lease_id"]: r["end_reason"] for r in client.call(now.leases, admin, True) if r["lease_id"] in leases}
    assert ended == {lease_id: "finished" for lease_id in leases}


def _named_broker_answers(client) -> bool:
    import ray

    try:
        return bool(ray.get(ray.get_actor(client.BROKER_NAME, namespace=client.NAMESPACE).version.remote(), timeout=5))
    except (ValueError, ray.exceptions.RayError):
        return False
