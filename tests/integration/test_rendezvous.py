"""The ranks' rendezvous: no rank leaves it before every rank is connected.

Gloo connects its mesh one pair at a time, and the side that dials a peer counts the pair as
connected as soon as the dial succeeds. A rank whose function does no collective could then
finish and close its sockets while a slower peer (one starved of CPU, typically rank 0, which
also serves the store) is still connecting: that peer failed with "Gloo connectFullMesh failed
... Connection closed by peer", and the user's call with it. Here rank 0 is made slow on
purpose, in real processes with real gloo and a real TCPStore.
"""
from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from datetime import timedelta

WORLD_SIZE = 4
ROUNDS = 6  # which side dials is decided by port order: each round catches the race ~3 times in 4
SLOW_READ_S = 0.2
ROUND_TIMEOUT_S = 60.0


def _slow_store_class():
    import torch.distributed as dist

    class SlowToRead(dist.Store):
        """A store whose reads take SLOW_READ_S: a rank starved of CPU while its peers race on."""

        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def get(self, key):
            time.sleep(SLOW_READ_S)
            return self.inner.get(key)

        def set(self, key, value):
            return self.inner.set(key, value)

        def add(self, key, amount):
            return self.inner.add(key, amount)

        def check(self, keys):
            return self.inner.check(keys)

        def wait(self, keys, timeout=None):
            return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

        def compare_set(self, key, expected, desired):
            return self.inner.compare_set(key, expected, desired)

        def delete_key(self, key):
            return self.inner.delete_key(key)

        def num_keys(self):
            return self.inner.num_keys()

    return SlowToRead


def _rank(rank: int, ports, barrier, results) -> None:
    """One rank of runs whose function does nothing: join, leave at once; ROUNDS times."""
    import torch.distributed as dist

    from gpusession.run.rank.process_group import RankGroup
    from gpusession.run.spec import RankSpec

    store = None
    if rank == 0:  # opens the store on a port the OS picks and tells the others
        served = dist.TCPStore("127.0.0.1", 0, WORLD_SIZE, is_master=True,
                               timeout=timedelta(seconds=30), wait_for_workers=False)
        for _ in range(WORLD_SIZE - 1):
            ports.put(served.port)
        store, port = _slow_store_class()(served), served.port
    else:
        port = ports.get(timeout=ROUND_TIMEOUT_S)
    for round_ in range(ROUNDS):
        spec = RankSpec(rank=rank, world_size=WORLD_SIZE, local_rank=rank, local_world_size=WORLD_SIZE,
                        node_rank=0, master_addr="127.0.0.1", master_port=port, backend="gloo",
                        node_gpu_ids=(), gpu_ids=(), lease_id=1, logical_gpus=True, return_value=rank == 0,
                        caller_host="", caller_cwd="", pg_timeout_s=20.0, run_id=f"round-{round_}")
        try:
            barrier.wait(ROUND_TIMEOUT_S)
            RankGroup(spec, store).join()
            dist.destroy_process_group()
            outcome = "ok"
        except threading.BrokenBarrierError:
            return  # another rank failed and left: its outcome says why
        except Exception as exc:  # noqa: BLE001 - the message is what the test reports
            outcome = f"{type(exc).__name__}: {str(exc)[:200]}"
        results.put((round_, rank, outcome))
        if outcome != "ok":
            barrier.abort()
            return
    barrier.wait(ROUND_TIMEOUT_S)  # rank 0 serves the store: nobody leaves before the last read


def test_a_rank_that_finishes_at_once_never_breaks_a_slow_peer_still_connecting():
    context = multiprocessing.get_context("spawn")
    ports, results, barrier = context.Queue(), context.Queue(), context.Barrier(WORLD_SIZE)
    ranks = [context.Process(target=_rank, args=(rank, ports, barrier, results)) for rank in range(WORLD_SIZE)]
    for process in ranks:
        process.start()
    try:
        for process in ranks:
            process.join(ROUNDS * ROUND_TIMEOUT_S)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
    outcomes = []
    try:
        while len(outcomes) < ROUNDS * WORLD_SIZE:
            outcomes.append(results.get(timeout=5))
    except queue.Empty:
        pass
    failures = [o for o in outcomes if o[2] != "ok"]
    assert not failures, failures
    assert len(outcomes) == ROUNDS * WORLD_SIZE
