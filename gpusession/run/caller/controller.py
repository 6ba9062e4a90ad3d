"""A run: a sequence of attempts on one lease, until the function returns or the run must end.

The controller starts every rank of an attempt as a fresh process (through the worker actors),
follows the attempt (follower.py), and when a rank fails asks the failure policy (policies.py)
what to do: a fault (a process or a node lost, a broken collective) tears the attempt down on
every rank and starts the next one from the last checkpoint commit; an exception in user code
fails the call at once unless the user asked to retry it.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import ray

from ...errors import GPUSessionError, LaunchRefused
from ..comm_options import CommOptions
from ...observe.events import Observer, RunInfo
from ..bulk import loads_value, ship
from .rank_account import this_account
from ..spec import RankSpec
from ...broker.protocol.notice import Notice
from .follower import Follower
from ..heartbeat import silence_timeout
from .outcome import Failed, Finished, Resize, Stopped, TimedOut
from ..policies import (Action, FailureDecision, FailurePolicy, FaultKind, RunState, check_move, restart_line,
                       workers_after_host_loss)
from . import resize
from .commits import resume_point
from ..endings import terminal_state
from .crew import replace_lost_workers

log = logging.getLogger("gpusession")
PG_TIMEOUT_ENV = "GPUSESSION_PG_TIMEOUT_S"
DEFAULT_PG_TIMEOUT_S = 1800.0  # backstop only: a failing rank makes the caller stop all ranks


def resolve_backend(requested: str | None, *, logical: bool, gpus_per_worker: float) -> str:
    if requested:
        return requested
    return "nccl" if not logical and gpus_per_worker >= 1 else "gloo"


def rank_specs(lease, workers, *, backend: str, return_all: bool, attempt: int = 0,
               comm: CommOptions = CommOptions(), caller: "CallerPlace | None" = None) -> list[RankSpec]:
    """One spec per worker, ranks grouped by node (contiguous local ranks, like torchrun); rank 0
    is on the first node. Returns [(spec, worker)] in rank order. `caller`: whose run it is and
    from where, when the run is hosted for a kernel elsewhere (the gateway); None: this process's."""
    node_order: list[str] = []
    for slot in lease.slots:
        if slot.node_id not in node_order:
            node_order.append(slot.node_id)
    ordered = sorted(zip(lease.slots, workers), key=lambda pair: (node_order.index(pair[0].node_id), pair[0].index))
    pg_timeout = float(os.environ.get(PG_TIMEOUT_ENV, DEFAULT_PG_TIMEOUT_S))
    caller_host, caller_cwd, caller_account = socket.gethostname(), os.getcwd(), this_account()
    if caller is not None:
        caller_cwd, caller_account = caller.cwd, caller.account
    master_addr, master_port = _open_rendezvous(ordered[0][1].actor, len(ordered), pg_timeout, caller_account)
    run_id = uuid.uuid4().hex
    cluster = ray.get_runtime_context().get_session_name()
    local_counts = {n: sum(1 for s in lease.slots if s.node_id == n) for n in node_order}
    seen_on_node: dict[str, int] = {}
    specs = []
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
            caller_host=caller_host, caller_cwd=caller_cwd, pg_timeout_s=pg_timeout,
            run_id=run_id, group_id=lease.group_id, attempt=attempt, address=slot.address,
            node_id=slot.node_id, cluster=cluster, comm=comm, caller_account=caller_account,
        ), worker))
    return specs


def _open_rendezvous(actor, world_size: int, pg_timeout: float, account: str) -> tuple[str, int]:
    """Rank 0's store, started as the caller's account: a launcher that will not start that
    account fails the call here, with its reason (user and node), before any rank starts."""
    try:
        return ray.get(actor.open_rendezvous.remote(world_size, pg_timeout, account))
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, LaunchRefused):
            raise LaunchRefused(str(exc.cause)) from None
        raise


@dataclass(frozen=True)
class CallerPlace:
    """Whose run this is and the directory its kernel runs in, when the run is hosted by the
    gateway for a kernel of another account (the ranks run as that account, in that directory)."""

    account: str  # the caller's account name as the service verified it (SO_PEERCRED)
    cwd: str  # the kernel's working directory, as it said


def _unique(items) -> tuple[str, ...]:
    seen: list[str] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return tuple(seen)


class RunController:
    def __init__(self, lease, fn: Callable, args: tuple, kwargs: dict, *, info: RunInfo,
                 observer: Observer, checkpoint_ref=None, checkpoint_step=None, shipment=None,
                 raw_results: bool = False, caller: CallerPlace | None = None) -> None:
        self.lease, self.info, self.observer = lease, info, observer
        self.raw_results = raw_results  # return values still pickled (the gateway relays them unread)
        self.caller = caller
        self.options = lease.options
        self.policy = FailurePolicy(self.options.max_failures, self.options.retry_exceptions)
        self.silence_s = silence_timeout()
        self._call = (fn, args, kwargs)
        self._shipment = shipment
        self.shipment = None  # bulk.Shipment: kept for every attempt, and its buffers in the object store with it
        self.state = RunState.STARTING
        self.failures = 0
        self._run_id: str | None = None  # the current attempt's, once its ranks are specified
        _reset_run_fields(info, checkpoint_ref, checkpoint_step)
        # A held lease resized between runs: this run's record begins with how it got its size.
        info.transitions, lease.lines_between_runs = list(lease.lines_between_runs), []

    def run(self) -> Any:
        started = time.time()
        try:
            # shipped before the lease by @gs.distributed; a held lease's lease.run() ships here
            self.shipment = self._shipment or ship(*self._call)
            self.info.shipped_bytes, self.info.shipped_s = self.shipment.bulk_bytes, self.shipment.seconds
            return self._run(started)
        finally:
            _close_phases(self.info, self.lease, started)

    def _run(self, started: float) -> Any:
        backend = resolve_backend(self.options.backend, logical=self.lease.logical_gpus,
                                  gpus_per_worker=self.options.lease.gpus_per_worker)
        self.info.backend = backend
        deadline = started + self.options.timeout_s if self.options.timeout_s else None
        attempt = 0
        while True:
            try:
                end = self._attempt(backend, attempt, deadline)
            except BaseException as exc:  # the user's stop (interrupt, cancel) or a fault of our own
                self.lease.crew.stop_ranks(self._run_id)  # ranks may be stuck in a collective: stop them all
                self._move(terminal_state(exc), type(exc).__name__)
                raise
            match end:
                case Finished(results):
                    self._move(RunState.FINISHED, "the function returned")
                    if self.options.return_all:
                        return [self._value(results.get(r)) for r in range(len(results))]
                    return self._value(results.get(0))
                case Failed():
                    self._stop_survivors(end)
                    self._recover_or_raise(end, attempt)
                case Resize(notice):  # elastic: not a failure, never counted as one
                    self.lease.crew.stop_ranks(self._run_id)
                    self._resize(notice)
                case Stopped(error) | TimedOut(error):
                    self.lease.crew.stop_ranks(self._run_id)
                    self._move(terminal_state(error), type(error).__name__)
                    raise error
            attempt += 1

    def _attempt(self, backend: str, attempt: int, deadline: float | None):
        workers = self.lease.acquire_workers()
        ranks = rank_specs(self.lease, workers, backend=backend, return_all=self.options.return_all,
                           attempt=attempt, comm=self.options.comm, caller=self.caller)
        self._run_id = ranks[0][0].run_id
        checkpoint = [self.info.checkpoint_ref] if self.info.checkpoint_ref is not None else []
        launches = [(spec, (self.shipment, spec, checkpoint), worker) for spec, worker in ranks]
        follower = Follower(self.lease, launches, self.info, self.observer, launched=time.time(),
                            deadline=deadline, timeout_s=self.options.timeout_s, attempt=attempt,
                            silence_s=self.silence_s)
        self._follower = follower
        if self.state != RunState.RUNNING:
            self._move(RunState.RUNNING, f"attempt {attempt}")
        return follower.follow()

    def _value(self, value) -> Any:
        if self.raw_results:  # the caller's kernel unpickles it (gateway/remote.py adds its time)
            return value
        unpickling = time.perf_counter()
        loaded = _loads(value)
        self.info.returned_s += time.perf_counter() - unpickling
        return loaded

    def _stop_survivors(self, failed: Failed) -> None:
        """Stop every rank that can still be reached, now; a lost host's workers are dropped from
        the lease, so nothing (stopping, cleaning up, waiting for its GPUs) waits on them."""
        follower = self._follower
        if failed.fault.kind is FaultKind.HOST_LOST:
            self.lease.drop_workers([follower.rank_workers[r] for r in sorted(follower.lost_ranks)],
                                    lost_nodes=set(follower.lost_nodes))
        self.lease.crew.stop_ranks(self._run_id)

    def _recover_or_raise(self, failed: Failed, attempt: int) -> None:
        decision = self.policy.decide(failed.fault, self.failures)
        shrink_to = None
        if decision.action is Action.RETRY and failed.fault.kind is FaultKind.HOST_LOST:
            workers = workers_after_host_loss(self.lease.size, len(self._follower.lost_ranks),
                                              self.options.lease.min_workers)
            if workers < self.lease.size:  # elastic: go on with the survivors
                shrink_to = workers
            else:  # at its size: on GPUs free now on other hosts, or not at all
                decision = self._move_off_lost_hosts(failed) or decision
        if decision.action is Action.RAISE:
            if self.failures:
                failed.error.args = (failed.error.args[0] + f" The run had restarted {self.failures} "
                                     f"time(s) before; {decision.why}.",)
            self._move(RunState.FAILED, decision.why)
            raise failed.error
        self.failures += 1
        follower = self._follower
        if shrink_to is not None:
            resize.shrink_after_host_loss(self.lease, shrink_to)
            self.info.gpus, self.info.workers = self.lease.gpus, self.lease.workers  # the status line's count
        elif failed.fault.kind is not FaultKind.HOST_LOST:
            replace_lost_workers(self.lease, follower.lost_ranks)
        where = resume_point(self.info)
        line = restart_line(failed.fault, resume_step=where, attempt=self.failures + 1,
                            max_attempts=self.options.max_failures + 1,
                            gpus=self.lease.gpus if shrink_to is not None else None)
        self.info.restarts += 1
        self.info.transitions.append(line)
        self._move(RunState.RESTARTING, line)
        log.info("Lease %s: %s", self.lease.lease_id, line)
        self.observer.transition(self.info, line)
        self._move(RunState.STARTING, f"attempt {attempt + 1}")

    def _move_off_lost_hosts(self, failed: Failed) -> FailureDecision | None:
        """The broker moves the lost hosts' workers to free GPUs elsewhere and the lease re-makes
        its group there (None: done); or the run cannot restart, and the error says why."""
        try:
            why = self.lease.move_off_lost_hosts()
        except (GPUSessionError, ray.exceptions.RayError) as exc:  # e.g. Ray did not place the group
            why = f"moving to the hosts that remain failed ({type(exc).__name__}: {exc})"
        if why is None:
            return None
        failed.error.args = (f"{failed.error.args[0]} It was not restarted: {why}.",)
        return FailureDecision(Action.RAISE, why)

    def _resize(self, notice: Notice) -> None:
        """Continue at the size the broker asked for or offered, from the commit just made."""
        self._move(RunState.RESIZING, notice.kind.value)
        where = resume_point(self.info)
        gpw = self.options.lease.gpus_per_worker
        sizes = resize.carry_out(self.lease, notice)
        self.lease.rearm()
        self.info.gpus, self.info.workers = self.lease.gpus, self.lease.workers  # the status line's count
        if sizes is not None:
            line = resize.resize_line(notice, old_gpus=sizes[0] * gpw, new_gpus=sizes[1] * gpw,
                                      full_gpus=self.options.lease.gpus, at=where)
            self.info.resizes += 1
            self.info.transitions.append(line)
            log.info("Lease %s: %s", self.lease.lease_id, line)
            self.observer.transition(self.info, line)
        self._move(RunState.STARTING, "resized" if sizes else "offer lapsed")

    def _move(self, target: RunState, why: str) -> None:
        log.debug("Run of lease %s: %s -> %s (%s)", self.lease.lease_id, self.state.value, target.value, why)
        self.state = check_move(self.state, target)
        self.info.state = target.value


def _close_phases(info: RunInfo, lease, started: float) -> None:
    """Make the receipt's phases add up to the time the GPUs were held for this run: setup is
    every second of it the function was not running (start, restarts, a failure before the
    function ran, stopping the ranks), run the seconds it ran. The first run of a lease begins at
    the grant (placing the workers is setup); a later run of a held lease when it is called."""
    begun = lease.granted_at if lease.granted_at is not None and not lease.has_run else started
    lease.has_run = True
    info.setup_s = max(0.0, time.time() - begun - info.run_s)


def _loads(value) -> Any:
    """A rank's returned value as the stream brought it (messages.Pickled or BulkValue), unpickled."""
    return loads_value(value)


def _reset_run_fields(info: RunInfo, checkpoint_ref, checkpoint_step=None) -> None:
    info.history = []
    info.setup_s = info.run_s = 0.0
    info.end_reason = None
    info.restarts = 0
    info.steps_lost = 0
    info.transitions = []
    info.rank_hosts = {}
    info.communication = None
    info.checkpoint_ref, info.checkpoint_step = checkpoint_ref, checkpoint_step


def run_function(lease, fn: Callable, args: tuple, kwargs: dict, *, info: RunInfo,
                 observer: Observer, checkpoint_ref=None, checkpoint_step=None, shipment=None,
                 raw_results: bool = False, caller: CallerPlace | None = None) -> Any:
    """Run the call on the lease. `raw_results`: return each value as the ranks pickled it
    (messages.Pickled or BulkValue) instead of unpickling it; `caller`: see rank_specs."""
    return RunController(lease, fn, args, kwargs, info=info, observer=observer, checkpoint_ref=checkpoint_ref,
                         checkpoint_step=checkpoint_step, shipment=shipment, raw_results=raw_results,
                         caller=caller).run()
