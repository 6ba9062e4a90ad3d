"""Run one function on every worker of a lease and follow it until every rank is done.

One loop in the caller's thread waits on all ranks' event streams and the broker's notice at
once (ray.wait), so output and metrics arrive as they happen, Ctrl-C is noticed within a poll,
and the first failing rank stops all the others (they may be stuck in a collective).
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any, Callable

import ray

from .errors import Preempted, RunTimeout, WorkerFailed
from .events import Observer, RunInfo
from .shipping import pickle_call
from .workers import RankSpec

POLL_S = 0.2  # how often the loop looks at the clock when no rank says anything
FAILURE_GRACE_S = 1.0  # after a rank's communication error, how long to wait for the root cause
_COLLATERAL_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")
_COLLATERAL_WORDS = ("connection closed", "connection reset", "broken pipe", "socket timeout",
                     "gloo/transport", "nccl communicator was aborted", "timed out")
PG_TIMEOUT_ENV = "GPUSESSION_PG_TIMEOUT_S"
DEFAULT_PG_TIMEOUT_S = 1800.0  # backstop only: a failing rank makes the caller kill all ranks


def resolve_backend(requested: str | None, *, logical: bool, gpus_per_worker: float) -> str:
    if requested:
        return requested
    return "nccl" if not logical and gpus_per_worker >= 1 else "gloo"


def rank_specs(lease, workers, *, backend: str, return_all: bool, restarts: int = 0) -> list[tuple]:
    """(spec, slot, worker) per rank, ranks grouped by node (contiguous local ranks, like
    torchrun); rank 0 is on the first node."""
    node_order: list[str] = []
    for slot in lease.slots:
        if slot.node_id not in node_order:
            node_order.append(slot.node_id)
    ordered = sorted(zip(lease.slots, workers), key=lambda pair: (node_order.index(pair[0].node_id), pair[0].index))
    pg_timeout = float(os.environ.get(PG_TIMEOUT_ENV, DEFAULT_PG_TIMEOUT_S))
    master_addr, master_port = ray.get(ordered[0][1].actor.open_rendezvous.remote(len(ordered), pg_timeout))
    caller_host, caller_cwd = socket.gethostname(), os.getcwd()
    run_id = uuid.uuid4().hex
    specs, local_counts = [], {n: sum(1 for s in lease.slots if s.node_id == n) for n in node_order}
    seen_on_node: dict[str, int] = {}
    for rank, (slot, worker) in enumerate(ordered):
        local_rank = seen_on_node.get(slot.node_id, 0)
        seen_on_node[slot.node_id] = local_rank + 1
        node_gpus = _unique(g for s, _ in ordered if s.node_id == slot.node_id for g in s.gpu_ids)
        specs.append((RankSpec(
            rank=rank, world_size=len(ordered), local_rank=local_rank,
            local_world_size=local_counts[slot.node_id], node_rank=node_order.index(slot.node_id),
            master_addr=master_addr, master_port=master_port, backend=backend,
            node_gpu_ids=node_gpus, gpu_ids=slot.gpu_ids, lease_id=lease.lease_id,
            logical_gpus=lease.logical_gpus, return_value=return_all or rank == 0,
            caller_host=caller_host, caller_cwd=caller_cwd, pg_timeout_s=pg_timeout, restarts=restarts,
            run_id=run_id, group_id=lease.group_id,
        ), slot, worker))
    return specs


def _unique(items) -> tuple[str, ...]:
    seen: list[str] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return tuple(seen)


def run_function(lease, fn: Callable, args: tuple, kwargs: dict, *, info: RunInfo,
                 observer: Observer, checkpoint_ref=None) -> Any:
    options = lease.options
    _reset_run_fields(info, checkpoint_ref)
    call_ref = ray.put(pickle_call(fn, args, kwargs))
    backend = resolve_backend(options.backend, logical=lease.logical_gpus,
                              gpus_per_worker=options.lease.gpus_per_worker)
    info.backend = backend
    try:
        workers = lease.acquire_workers(options.runtime_env)
        ranks = rank_specs(lease, workers, backend=backend, return_all=options.return_all)
        checkpoint = [checkpoint_ref] if checkpoint_ref is not None else []
        launched = time.time()
        streams = {worker.actor.run.remote(call_ref, spec, checkpoint): spec.rank for spec, _, worker in ranks}
        rank_nodes = {spec.rank: slot.address for spec, slot, _ in ranks}
        follower = _Follower(lease, streams, info, observer, launched, options.timeout_s, rank_nodes)
        results = follower.follow()
    except BaseException:
        lease.retire_workers(dirty=True)  # ranks may be stuck in a collective: kill them all
        raise
    if follower.cuda_used:
        lease.retire_workers(dirty=False)
    else:
        lease.mark_workers_clean()
    return [results[r] for r in range(len(ranks))] if options.return_all else results.get(0)


def _reset_run_fields(info: RunInfo, checkpoint_ref) -> None:
    info.history = []
    info.setup_s = info.run_s = 0.0
    info.end_reason = None
    info._checkpoint_ref = checkpoint_ref


class _Follower:
    def __init__(self, lease, streams: dict, info: RunInfo, observer: Observer, launched: float,
                 timeout_s: float | None, rank_nodes: dict[int, str]) -> None:
        self.lease, self.streams, self.info, self.observer = lease, streams, info, observer
        self.rank_nodes = rank_nodes
        self.world_size = len(streams)
        self.deadline = launched + timeout_s if timeout_s else None
        self.timeout_s = timeout_s
        self.payload_kind: dict[int, str] = {}
        self.results: dict[int, Any] = {}
        self.started: set[int] = set()
        self.run_started: float | None = None
        self.cuda_used = False
        self.checkpoints = 0
        self.stop_at_checkpoint: tuple[float, dict] | None = None
        self.failures: list[tuple[int, WorkerFailed]] = []  # (rank of evidence: 0 root .. 2 collateral)
        self.failing_since: float | None = None

    def follow(self) -> dict[int, Any]:
        try:
            return self._follow()
        finally:  # a failed or interrupted run still says how long the function ran
            if self.run_started is not None:
                self.info.run_s = time.time() - self.run_started

    def _follow(self) -> dict[int, Any]:
        while self.streams:
            watch = self.lease.watch_ref
            waitables = list(self.streams) + ([watch] if watch is not None and self.lease._notice is None else [])
            ready, _ = ray.wait(waitables, num_returns=1, timeout=self._poll_timeout())
            for item in ready:
                if item is watch:
                    self._on_notice()
                else:
                    self._advance(item)
            self._check_failures()
            self._check_clocks()
            self.observer.poll()
        return self.results

    def _fail(self, failure: WorkerFailed, *, collateral: bool) -> None:
        self.failures.append((2 if collateral else 0, failure))
        self.failing_since = self.failing_since or time.monotonic()

    def _check_failures(self) -> None:
        """Raise the root cause: a rank's own error or death at once; a communication error
        (often the echo of a peer's failure) only after the peers had a moment to report."""
        if not self.failures:
            return
        best = min(self.failures, key=lambda f: f[0])
        waited = time.monotonic() - self.failing_since
        if best[0] == 0 or waited >= FAILURE_GRACE_S or not self.streams:
            others = [f for _, f in self.failures if f is not best[1]]
            if best[0] != 0 and others:  # no root cause found: show what every rank reported
                best[1].args = (best[1].args[0] + " Other ranks: " + "; ".join(
                    f"rank {f.rank}: {f.remote_type}: {(f.remote_message or '')[:300]}" for f in others),)
            raise best[1]

    def _poll_timeout(self) -> float:
        if self.deadline is None:
            return POLL_S
        return max(0.0, min(POLL_S, self.deadline - time.time()))

    def _check_clocks(self) -> None:
        now = time.time()
        if self.deadline is not None and now >= self.deadline and self.streams:
            raise RunTimeout(
                f"The run exceeded timeout={self.timeout_s:g} s and its workers were stopped. Raise timeout, "
                "or save checkpoints (gs.save_checkpoint) and resume from the last one."
            )
        if self.stop_at_checkpoint is not None and now >= self.stop_at_checkpoint[0]:
            raise self._preempted(self.stop_at_checkpoint[1])

    def _advance(self, stream) -> None:
        rank = self.streams[stream]
        try:
            ref = next(stream)
        except StopIteration:
            del self.streams[stream]
            return
        kind = self.payload_kind.pop(rank, None)
        if kind == "checkpoint":
            self.info._checkpoint_ref = ref  # kept, not fetched: the caller owns it
            self.checkpoints += 1
            if self.stop_at_checkpoint is not None:
                raise self._preempted(self.stop_at_checkpoint[1])
            return
        try:
            event = ray.get(ref)
        except ray.exceptions.RayError as exc:
            del self.streams[stream]
            self._fail(self._worker_died(rank, exc), collateral=False)
            return
        if kind == "result":
            self.results[rank] = event
            return
        self._on_event(rank, event)

    def _on_event(self, rank: int, event: tuple) -> None:
        kind = event[0]
        if kind == "out":
            for stream_name, text in event[1]:
                self.observer.output(rank, stream_name, text)
        elif kind == "report":
            self.info.history.append(event[1])
            self.observer.report(event[1], self.info)
        elif kind == "started":
            self.started.add(rank)
            if len(self.started) == self.world_size:
                self.run_started = time.time()
                self.info.setup_s = self.run_started - (self.lease.granted_at or self.run_started)
                self.observer.running(self.info)
        elif kind in ("checkpoint", "result"):
            if kind == "checkpoint" or event[1]:
                self.payload_kind[rank] = kind
        elif kind == "error":
            self._fail(self._worker_failed(event[1]), collateral=_is_collateral(event[1]))
        elif kind == "end":
            self.cuda_used = self.cuda_used or event[1].get("cuda_used", False)

    def _on_notice(self) -> None:
        from .lease import notice_error

        notice = self.lease.notice()
        if notice is None:  # the broker was replaced; the lease now watches the new one
            return
        if notice.get("kind") == "preempt" and self.checkpoints:
            # stop at the next commit point, or just before the broker takes the GPUs
            self.stop_at_checkpoint = (notice["deadline"] - 1.0, notice)
            return
        raise notice_error(self.lease, notice, checkpointed=bool(self.checkpoints))

    def _preempted(self, notice: dict) -> Preempted:
        from .lease import notice_error

        return notice_error(self.lease, notice, checkpointed=True)

    def _worker_failed(self, failure: dict) -> WorkerFailed:
        return WorkerFailed(
            f"Rank {failure['rank']} on {failure['node']} raised {failure['type']}: {failure['message']}. "
            f"Every worker was stopped and the {self.lease.gpus:g} GPUs released.",
            rank=failure["rank"], node=failure["node"], remote_type=failure["type"],
            remote_message=failure["message"], remote_traceback=failure["traceback"],
        )

    def _worker_died(self, rank: int, exc: Exception) -> WorkerFailed:
        slot_address = self.rank_nodes.get(rank, "?")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return WorkerFailed(
            f"The worker process of rank {rank} died ({type(exc).__name__}: {message}). Every worker was "
            f"stopped and the {self.lease.gpus:g} GPUs released.",
            rank=rank, node=slot_address, remote_type=type(exc).__name__, remote_message=message,
        )


def _is_collateral(failure: dict) -> bool:
    """A collective that failed because a peer went away, rather than this rank's own error."""
    if failure["type"] in _COLLATERAL_TYPES:
        return True
    message = failure["message"].lower()
    return failure["type"] == "RuntimeError" and any(word in message for word in _COLLATERAL_WORDS)
