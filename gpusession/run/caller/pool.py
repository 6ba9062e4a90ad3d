"""Warm worker actors kept by this kernel between calls, per node and runtime_env.

Workers hold no Ray resources; the lease's placement group holds the GPUs. A worker never runs
user code itself (each rank is a fresh process forked from the node's warm parent, see
workers.py), so every worker that is still alive goes back to the pool after a call, on real
GPUs too. A worker this kernel lacks on a node comes from the node's host (nodehost.py): a
spare already up and connected to the node's warm parent, shared by every kernel. Only a call
with its own runtime_env (or from a Ray job with one) starts workers of its own (owned by this
process: they die with it), each with its own warm parent in that environment.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ...errors import GPUSessionError
from ..node import nodehost
from ...cluster import raycluster

IDLE_S_ENV = "GPUSESSION_WARM_WORKER_IDLE_S"
DEFAULT_IDLE_S = 600.0  # an idle worker and its warm parent cost ~500 MB of RAM; give them back after this
MAX_IDLE_PER_NODE = 16
REPLACE_DELAY_S = 3.0  # start replacements after the release, not during the next lease's start
ALIVE_TIMEOUT_S = 2.0
HOST_ANSWER_S = 2.0  # a host that is up answers at once
HOST_PROBE_TIMEOUT_S = 60.0


@dataclass(eq=False)
class WorkerHandle:
    actor: ray.actor.ActorHandle | None  # None until the node host handed one over (see `ready`)
    node_id: str
    env_key: str
    ready: ray.ObjectRef  # resolves to the worker's info once it imported torch (to the actor while actor is None)
    runtime_env: dict | None = None
    idle_since: float = field(default_factory=time.monotonic)
    info: dict | None = None  # node_id, address, pid, host: filled once ready


def _env_key(runtime_env: dict | None) -> str:
    return json.dumps(runtime_env or {}, sort_keys=True, default=str)


class WorkerPool:
    def __init__(self) -> None:
        self._idle: dict[tuple[str, str], list[WorkerHandle]] = {}
        self._lock = threading.Lock()
        self._idle_s = float(os.environ.get(IDLE_S_ENV, DEFAULT_IDLE_S))
        self._reaper: threading.Timer | None = None
        self._hosts: dict[str, ray.actor.ActorHandle] = {}  # node id -> its node host
        self._started: dict[str, float] = {}  # node id -> when this pool started its host (it found none)

    def checkout(self, node_ids: list[str], runtime_env: dict | None) -> list[WorkerHandle]:
        """One worker per entry of node_ids, warm ones first; new ones start now, not awaited."""
        key = _env_key(runtime_env)
        with self._lock:
            handles = []
            for node_id in node_ids:
                handle = self._take(node_id, key)
                if handle is not None and handle.actor is not None:  # it may have died while idle: ask it
                    handle.ready = handle.actor.info.remote()
                handles.append(handle or self._start(node_id, runtime_env))
            return handles

    def wait_ready(self, handles: list[WorkerHandle]) -> list[WorkerHandle]:
        """The same workers once ready, with any that died replaced once by fresh ones."""
        dead = self._dead(handles)
        if dead:
            for handle, _ in dead:
                _kill(handle)
            fresh = {id(h): self._start(h.node_id, h.runtime_env) for h, _ in dead}
            handles = [fresh.get(id(h), h) for h in handles]
            still_dead = self._dead(list(fresh.values()))
            if still_dead:
                self.discard(handles)
                reason = str(still_dead[0][1]).strip().splitlines()[-1][:300]
                raise GPUSessionError(
                    f"Could not start the worker processes ({reason}). Check runtime_env, the nodes' "
                    "memory, and that gpusession is installed on every node."
                )
        for handle, info in zip(handles, ray.get([h.ready for h in handles])):
            handle.info = info
        return handles

    def _dead(self, handles: list[WorkerHandle]) -> list[tuple[WorkerHandle, Exception]]:
        dead = []
        for handle in handles:
            try:
                if handle.actor is None:  # a spare from the node host: ready already
                    handle.actor = ray.get(handle.ready)
                    handle.ready = handle.actor.info.remote()
                ray.get(handle.ready)
            except Exception as exc:
                if handle.actor is None:  # the host itself is gone (stopped while idle): start it again
                    self._hosts.pop(handle.node_id, None)
                dead.append((handle, exc))
        return dead

    def alive(self, handles: list[WorkerHandle]) -> list[WorkerHandle]:
        """The handles whose actor still answers; the others are killed for good."""
        answers = {id(h): h.actor.info.remote() for h in handles}
        ready, _ = ray.wait(list(answers.values()), num_returns=len(answers), timeout=ALIVE_TIMEOUT_S)
        alive = []
        for handle in handles:
            ref = answers[id(handle)]
            try:
                if ref in ready:
                    ray.get(ref)
                    alive.append(handle)
                    continue
            except Exception:
                pass
            _kill(handle)
        return alive

    def acquire(self, node_ids: list[str], runtime_env: dict | None) -> list[WorkerHandle]:
        return self.wait_ready(self.checkout(node_ids, runtime_env))

    def give_back(self, handles: list[WorkerHandle]) -> None:
        now = time.monotonic()
        with self._lock:
            for handle in handles:
                bucket = self._idle.setdefault((handle.node_id, handle.env_key), [])
                if len(bucket) >= MAX_IDLE_PER_NODE:
                    _kill(handle)
                    continue
                handle.idle_since = now
                bucket.append(handle)
        self._schedule_reap()

    def discard(self, handles: list[WorkerHandle], *, replace: bool = False,
                runtime_env: dict | None = None) -> None:
        """Kill these workers; with replace, top the pool up with fresh ones on the same nodes a
        little later (starting processes that import torch right away would slow down whichever
        lease starts next on a small machine)."""
        for handle in handles:
            _kill(handle)
        if replace and handles:
            wanted: dict[str, int] = {}
            for handle in handles:
                wanted[handle.node_id] = wanted.get(handle.node_id, 0) + 1
            timer = threading.Timer(REPLACE_DELAY_S, self._top_up, args=(wanted, runtime_env))
            timer.daemon = True
            timer.start()

    def _top_up(self, wanted: dict[str, int], runtime_env: dict | None) -> None:
        key = _env_key(runtime_env)
        fresh = []
        try:
            with self._lock:
                for node_id, count in wanted.items():
                    idle = len(self._idle.get((node_id, key), []))
                    fresh += [self._start(node_id, runtime_env) for _ in range(max(0, count - idle))]
        except Exception:  # Ray shut down meanwhile: nothing to warm
            return
        self.give_back(fresh)

    def shutdown(self) -> None:
        with self._lock:
            for bucket in self._idle.values():
                for handle in bucket:
                    _kill(handle)
            self._idle.clear()

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._idle.values())

    def _take(self, node_id: str, key: str) -> WorkerHandle | None:
        bucket = self._idle.get((node_id, key))
        return bucket.pop() if bucket else None

    def _start(self, node_id: str, runtime_env: dict | None) -> WorkerHandle:
        # A spare from the node's host, shared by every kernel; not for a kernel whose Ray job
        # has a runtime_env of its own (its workers would inherit it, and their warm parent too).
        if not runtime_env and not ray.get_runtime_context().runtime_env:
            job_id = ray.get_runtime_context().get_job_id()
            return WorkerHandle(None, node_id, _env_key(None), self._host(node_id).worker.remote(job_id), None)
        actor = nodehost.REMOTE_WORKER.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), runtime_env=runtime_env,
        ).remote()
        return WorkerHandle(actor, node_id, _env_key(runtime_env), actor.info.remote(), runtime_env)

    def probe_bundles(self, group, count: int, gpus_per_bundle: float) -> list[tuple] | None:
        """Each bundle's (node id, address, GPU ids), found by the nodes' hosts with Ray workers
        that are already up; None if a host could not tell (the caller then probes itself)."""
        try:
            bundle_nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
            hosts = [self._host(bundle_nodes[i]) for i in range(count)]
            # A host this pool started moments ago has no prober yet (it starts one once quiet):
            # asking it would only add HOST_ANSWER_S to a cold node's first call.
            if any(too_young_to_probe(self._started.get(bundle_nodes[i]), time.monotonic()) for i in range(count)):
                return None
            # A host that is still starting would make the caller wait longer than its own probe.
            if not all(ray.get([host.probe_ready.remote() for host in set(hosts)], timeout=HOST_ANSWER_S)):
                return None
            # One request per node for all its bundles: the node's prober runs them in its one warm worker.
            by_host: dict = {}
            for index, host in enumerate(hosts):
                by_host.setdefault(host, []).append(index)
            answers = {host: host.probe.remote(group.id.hex(), indices, gpus_per_bundle)
                       for host, indices in by_host.items()}
            found: list = [None] * count
            for host, slots in zip(answers, ray.get(list(answers.values()), timeout=HOST_PROBE_TIMEOUT_S)):
                for index, slot in zip(by_host[host], slots):
                    found[index] = tuple(slot)
            return found
        except Exception:  # a host starting, stopping or gone; the group removed meanwhile
            return None

    def _host(self, node_id: str) -> ray.actor.ActorHandle:
        host = self._hosts.get(node_id)
        if host is None:
            try:  # one running already (another kernel's, or ours before Ray's session renewed)
                host = ray.get_actor(nodehost.host_name(node_id), namespace=nodehost.NAMESPACE)
                self._started.pop(node_id, None)
            except ValueError:  # none: this call starts it, on a cold node
                gpus = next((n.gpus for n in raycluster.nodes() if n.node_id == node_id), 1.0)
                host = nodehost.host_for(node_id, nodehost.default_spares(gpus))
                self._started[node_id] = time.monotonic()
            self._hosts[node_id] = host
        return host

    def _schedule_reap(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Timer(min(60.0, self._idle_s), self._reap)
            self._reaper.daemon = True
            self._reaper.start()

    def _reap(self) -> None:
        cutoff = time.monotonic() - self._idle_s
        with self._lock:
            for key, bucket in self._idle.items():
                keep = [h for h in bucket if h.idle_since > cutoff]
                for handle in bucket:
                    if handle not in keep:
                        _kill(handle)
                self._idle[key] = keep
            remaining = any(self._idle.values())
        self._reaper = None
        if remaining:
            self._schedule_reap()


def too_young_to_probe(started: float | None, now: float) -> bool:
    """Whether a node host this pool started at `started` (None: found running) cannot have its
    prober yet: it starts one only once no worker was asked for QUIET_S (nodehost.py)."""
    return started is not None and now - started < nodehost.QUIET_S


def _kill(handle: WorkerHandle) -> None:
    try:
        if handle.actor is None:  # still on its way from the node host
            handle.actor = ray.get(handle.ready, timeout=ALIVE_TIMEOUT_S)
        ray.kill(handle.actor, no_restart=True)
    except Exception:  # already dead, or Ray already shut down
        pass


_pool: WorkerPool | None = None
_pool_job: str | None = None
_pool_lock = threading.Lock()


def pool() -> WorkerPool:
    """The process's pool, renewed when this process connects to a new Ray session."""
    global _pool, _pool_job
    job = ray.get_runtime_context().get_job_id()
    with _pool_lock:
        if _pool is None or _pool_job != job:
            _pool, _pool_job = WorkerPool(), job
        return _pool
