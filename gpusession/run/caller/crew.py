"""The worker actors of one lease: one per bundle, warm from the process's pool, kept across the
attempts and runs of the lease, and given back warm when it is released.

The lease (run/caller/lease.py) holds the GPUs and its crew; the run path drives the crew: start
ranks on it (controller.py), stop them, ask them to commit, and replace workers that were lost.
"""
from __future__ import annotations

import collections

import ray

from .pool import WorkerHandle, pool

CLEANUP_TIMEOUT_S = 2.0  # bound on the workers removing the lease's scratch directory
STOP_TIMEOUT_S = 2.0  # bound on the workers killing their rank processes


class Crew:
    def __init__(self, runtime_env: dict | None) -> None:
        self.runtime_env = runtime_env
        self.handles: list[WorkerHandle] = []  # in bundle order
        self.ready = False  # every handle answered (and the broker was told who they are)

    def assign(self, nodes: list[str], keep: list[WorkerHandle]) -> None:
        """One worker per bundle node: a kept one on that node if any (rank 0's stays rank 0's,
        with its rendezvous warm), else one from the pool; kept ones left over go back to it.
        The new ones start now and are not awaited (they start while the bundles are probed)."""
        keep, chosen = list(keep), []
        for node in nodes:
            handle = next((h for h in keep if h.node_id == node), None)
            if handle is not None:
                keep.remove(handle)
            chosen.append(handle or pool().checkout([node], self.runtime_env)[0])
        pool().give_back(keep)
        self.handles, self.ready = chosen, False

    def take(self) -> list[WorkerHandle]:
        """Every worker, for the lease's next group (a resize or a move): the crew is empty after."""
        taken, self.handles, self.ready = self.handles, [], False
        return taken

    def make_ready(self, nodes: list[str]) -> bool:
        """Workers for these bundle nodes, ready; True when they became ready now (the broker is
        then told who they are, so it can stop them if it must take the lease back)."""
        if not self.handles:
            self.handles, self.ready = pool().checkout(nodes, self.runtime_env), False
        if self.ready:
            return False
        self.handles, self.ready = pool().wait_ready(self.handles), True
        return True

    def stop_ranks(self, run_id: str | None = None) -> None:
        """Kill every rank process of the attempt `run_id` now (a survivor may be blocked in a
        collective whose peer is gone); the worker actors stay, warm for the next attempt."""
        if self.handles:
            stops = [worker.actor.stop.remote(run_id) for worker in self.handles]
            ray.wait(stops, num_returns=len(stops), timeout=STOP_TIMEOUT_S)

    def drop(self, handles: list[WorkerHandle]) -> None:
        """These workers (a lost host's) leave the crew now and are killed: nothing waits on them."""
        dropped = [h for h in self.handles if any(h is d for d in handles)]
        self.handles = [h for h in self.handles if not any(h is d for d in handles)]
        pool().discard(dropped)

    def request_checkpoints(self, reason: str, wanted: bool = True) -> None:
        """Make gs.should_checkpoint() true (or false again: an offer lapsed) in every rank of the
        current attempt."""
        for worker in self.handles:
            worker.actor.request_checkpoint.remote(reason, wanted)

    def clean_up(self, lease_id: int | None) -> None:
        """The lease ends: its scratch directories go (before anything may kill a worker)."""
        if self.handles and self.ready:  # only workers that ran made a scratch directory
            cleanups = [worker.actor.cleanup.remote(lease_id) for worker in self.handles]
            ray.wait(cleanups, num_returns=len(cleanups), timeout=CLEANUP_TIMEOUT_S)

    def give_back(self, *, broker_told: bool) -> None:
        """The workers go back to the pool warm (they never run user code: each rank is a process
        of its own that has exited; a dead one is replaced at its next checkout) once the broker
        knows the lease ended. Until then the broker may still take the lease back and kill the
        workers it was told of, which by then could be another lease's: so workers of a lease
        whose end the broker did not hear are killed here instead."""
        if self.handles:
            if broker_told:
                pool().give_back(self.handles)
            else:
                pool().discard(self.handles)
        self.handles, self.ready = [], False


def replace_lost_workers(lease, lost_ranks: set[int]) -> None:
    """After a worker actor died while its host answers: the lease finds where its bundles are
    now (telling the broker if Ray moved one), and each bundle gets a live worker."""
    if not lost_ranks:
        return
    crew = lease.crew
    alive = pool().alive(crew.handles)
    lease.reprobe_slots()
    spare: dict[str, list[WorkerHandle]] = collections.defaultdict(list)
    for handle in alive:
        spare[handle.node_id].append(handle)
    workers = []
    for slot in lease.slots:
        handle = spare[slot.node_id].pop() if spare[slot.node_id] else None
        workers.append(handle or pool().checkout([slot.node_id], crew.runtime_env)[0])
    pool().give_back([h for handles in spare.values() for h in handles])
    crew.handles, crew.ready = workers, False
