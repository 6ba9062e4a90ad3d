"""Follow one attempt: every rank's message stream and the broker's notice, in one loop.

One loop in the caller's thread waits on all ranks' streams and the broker's notice at once
(ray.wait), so output and metrics arrive as they happen, Ctrl-C is noticed within a poll, and
the first failing rank ends the attempt. `follow()` returns how the attempt ended as a value
(outcome.py); the controller then stops every other rank (they may be stuck in a collective)
and decides whether to restart. The judgements (root cause, host or worker, the clock) are pure
functions in judgements.py; lost workers and hosts are told apart in losses.py.
"""
from __future__ import annotations

import enum
import time
from typing import Any

import ray

from ...errors import LaunchRefused, ResultTooLarge, RunTimeout, WorkerFailed
from ...observe.events import Observer, RunInfo
from . import commits, judgements as judge
from .. import messages as m
from ..bulk import value_size
from .losses import Losses
from .notices import notice_error
from ...broker.protocol.notice import Notice, NoticeKind
from .outcome import AttemptEnd, Failed, Finished, Resize, Stopped, TimedOut
from ..policies import Fault, FaultKind, is_collective_fault, run_began, signal_name
from .resize import deadline_to_act

POLL_S = 0.2  # how often the loop looks at the clock when no rank says anything
FAILURE_GRACE_S = 1.0  # after a rank's communication error, how long to wait for the root cause
# After a rank's process died, how long its host's heartbeat has to say the whole host went: a
# host killed at once loses its processes one by one, and a rank's worker can report its rank's
# death a moment before the worker's own end closes the heartbeat (seen: the run restarted for
# "rank 3 died (exit code None)", then found the host lost). A death alone restarts this later.
DEATH_GATHER_S = 0.5
DRAIN_S = 0.3  # after a failure, how long to keep taking what the other ranks already sent


LAUNCH_REFUSED = "gpusession.errors.LaunchRefused"  # in a RankError's mro (run/node/worker.py)


class Payload(enum.Enum):
    """What a rank's next stream item is, as its message before it announced."""

    CHECKPOINT = "checkpoint"
    RESULT = "result"


class Follower:
    def __init__(self, lease, ranks: list, info: RunInfo, observer: Observer, *, launched: float,
                 deadline: float | None, timeout_s: float | None, attempt: int,
                 silence_s: float | None = None) -> None:
        self.lease, self.info, self.observer = lease, info, observer
        self.streams = {worker.actor.run.remote(*launch): spec.rank for spec, launch, worker in ranks}
        self.losses = Losses(lease, ranks, silence_s=silence_s,
                             fail=lambda fault, error: self._fail(fault, error, collateral=False))
        self.world_size = len(ranks)
        self.run_id = ranks[0][0].run_id if ranks else None
        self.deadline, self.timeout_s, self.attempt = deadline, timeout_s, attempt
        self.launched = launched
        self.payload_kind: dict[int, Payload] = {}
        self.payload_bytes: dict[int, int] = {}  # rank -> the size its Result announced
        self.results: dict[int, Any] = {}
        self.started: set[int] = set()
        self.started_at: dict[int, float] = {}  # rank -> its own clock when it entered the function
        self.run_started: float | None = None
        self.checkpoints = 0
        self.watched = False  # rank 0 called gs.should_checkpoint(): it commits when asked
        self.reported = False  # this attempt's first report marks where it resumed
        self.stop_at_checkpoint: tuple[float, dict] | None = None
        self.resize_at_checkpoint: tuple[float, dict] | None = None  # (act by, shrink or grow notice)
        self.failures: list[tuple[bool, Fault, WorkerFailed, float]] = []  # (collateral, fault, error, when)
        self.failing_since: float | None = None

    # what the controller needs to recover from a loss
    @property
    def rank_workers(self) -> dict:
        return self.losses.rank_workers

    @property
    def lost_ranks(self) -> set[int]:
        return self.losses.lost_ranks

    @property
    def lost_nodes(self) -> dict[str, str]:
        return self.losses.lost_nodes

    def follow(self) -> AttemptEnd:
        """Follow the attempt to its end: how it ended, as a value."""
        try:
            return self._follow()
        finally:  # a failed or interrupted run still says how long the function ran
            self.losses.close()
            if self.run_started is not None:
                self.info.run_s += time.time() - self.run_started

    def _follow(self) -> AttemptEnd:
        while self.streams:
            watch = self.lease.watch_ref
            waitables = list(self.streams) + ([watch] if watch is not None and not self.lease.has_notice else [])
            timeout = judge.poll_timeout(time.time(), self.deadline, POLL_S)
            ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
            for item in ready:
                end = self._on_notice() if item is watch else self._advance(item)
                if end is not None:
                    return end
            self.losses.check_heartbeats()
            self.losses.settle_suspects()
            end = self._check_failures() or self._check_clocks()
            if end is not None:
                return end
            self.observer.poll()  # the user's own stop (interrupt, cancel) raises here
        self.losses.check_heartbeats(wait=True)
        self.losses.settle_suspects(wait=True)
        end = self._check_failures()
        if end is not None:
            return end
        fetching = time.perf_counter()
        values = {}
        for rank, ref in self.results.items():
            try:
                values[rank] = ray.get(ref) if ref is not None else None
            except ray.exceptions.RayError as exc:  # Ray could not store it: the rank's stream ended there
                if not _store_refused(exc):
                    raise
                return Failed(*self._payload_refused(rank, Payload.RESULT, exc))
        self.info.returned_s = time.perf_counter() - fetching
        self.info.returned_bytes = sum(value_size(value) for value in values.values())
        return Finished(values)

    # ----- failures -------------------------------------------------------------------------------
    def _fail(self, fault: Fault, error: WorkerFailed | LaunchRefused, *, collateral: bool) -> None:
        now = time.monotonic()
        self.failures.append((collateral, fault, error, now))
        self.failing_since = self.failing_since or now

    def _check_failures(self) -> AttemptEnd | None:
        """End the attempt on the root cause (judgements.root_cause)."""
        if not self.failures or self.losses.suspects or self.losses.pending:
            return None  # a suspect host, or a lost heartbeat, is judged first: it may be the root cause
        now = time.monotonic()
        chosen = judge.root_cause(
            [judge.Failure(collateral, i, host_lost=fault.kind is FaultKind.HOST_LOST,
                           died_s=now - at if fault.kind is FaultKind.PROCESS_DIED else None)
             for i, (collateral, fault, _, at) in enumerate(self.failures)],
            waited_s=now - self.failing_since, grace_s=FAILURE_GRACE_S, ranks_left=len(self.streams),
            death_gather_s=DEATH_GATHER_S)
        if chosen is None:
            return None
        end = self._drain(DRAIN_S)
        if end is not None:  # the commit just taken is where the run was to stop or resize anyway
            return end
        collateral, fault, error, _ = self.failures[chosen]
        others = [e for _, _, e, _ in self.failures if e is not error]
        if collateral and others:  # no root cause found: show what every rank reported
            error.args = (error.args[0] + " Other ranks: " + "; ".join(
                f"rank {e.rank}: {e.remote_type}: {(e.remote_message or '')[:300]}" if isinstance(e, WorkerFailed)
                else str(e)[:300] for e in others),)
        return Failed(fault, error)

    def _drain(self, budget_s: float) -> AttemptEnd | None:
        """Take what the other ranks already sent before their attempt is torn down: above all a
        checkpoint rank 0 committed just before a peer died, so the restart loses no step."""
        deadline = time.monotonic() + budget_s
        while self.streams:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(self.streams), num_returns=1, timeout=max(0.0, left))
            if not ready:
                return None
            end = self._advance(ready[0])
            if end is not None:
                return end
        return None

    def _check_clocks(self) -> AttemptEnd | None:
        stop, resize = self.stop_at_checkpoint, self.resize_at_checkpoint
        verdict = judge.clock_verdict(time.time(), deadline=self.deadline, ranks_left=len(self.streams),
                                      stop_at=stop[0] if stop else None, resize_at=resize[0] if resize else None,
                                      resize_kind=resize[1].kind if resize else None)
        if verdict is judge.ClockVerdict.TIMED_OUT:
            return TimedOut(RunTimeout(
                f"The run exceeded timeout={self.timeout_s:g} s and its workers were stopped. Raise timeout, "
                "or save checkpoints (gs.save_checkpoint) and resume from the last one."
            ))
        if verdict is judge.ClockVerdict.STOP:
            return self._stopped(stop[1])
        if verdict is judge.ClockVerdict.RESIZE:  # no commit in time: resume from the last one, smaller
            return Resize(resize[1])
        if verdict is judge.ClockVerdict.OFFER_LAPSED:  # watch for the next one
            self.resize_at_checkpoint = None
            self.lease.crew.request_checkpoints("", wanted=False)
            self.lease.rearm()
        return None

    # ----- messages ------------------------------------------------------------------------------
    def _advance(self, stream) -> AttemptEnd | None:
        """Take a rank's next stream item; an end when a commit is where the run stops or resizes."""
        rank = self.streams[stream]
        try:
            ref = next(stream)
        except StopIteration:
            del self.streams[stream]
            return None
        except ray.exceptions.RayError as exc:
            del self.streams[stream]
            pending = self.payload_kind.pop(rank, None)
            if pending is not None and _store_refused(exc):
                self._fail(*self._payload_refused(rank, pending, exc), collateral=False)
            else:
                self.losses.lost(rank, exc)
            return None
        kind = self.payload_kind.pop(rank, None)
        if kind is Payload.CHECKPOINT:
            try:
                held = commits.hold(ref)
            except ray.exceptions.RayError as exc:  # lost with rank 0's node before it reached us
                del self.streams[stream]
                self.losses.lost(rank, exc)
                return None
            return self._commit(rank, held)
        if kind is Payload.RESULT:
            self.results[rank] = ref
            return None
        try:
            message = ray.get(ref)
        except ray.exceptions.RayError as exc:
            del self.streams[stream]
            self.losses.lost(rank, exc)
            return None
        self._on_message(rank, message)
        return None

    def _commit(self, rank: int, held) -> AttemptEnd | None:
        """Rank 0's commit is ours: it becomes the checkpoint, its save_checkpoint returns, and a
        run told to stop or resize does so now."""
        if not (self.attempt and not self.reported):  # else the history still ends with redone steps
            self.info.checkpoint_step = commits.last_step(self.info.history)
        self.info.checkpoint_ref = held
        self.checkpoints += 1
        self.rank_workers[rank].actor.checkpoint_kept.remote(self.run_id)
        if self.stop_at_checkpoint is not None:
            return self._stopped(self.stop_at_checkpoint[1])
        if self.resize_at_checkpoint is not None:
            return Resize(self.resize_at_checkpoint[1])
        return None

    def _on_message(self, rank: int, message) -> None:
        if isinstance(message, m.Output):
            for stream_name, text in message.chunks:
                self.observer.output(rank, stream_name, text)
        elif isinstance(message, m.Report):
            if self.attempt and not self.reported:
                self._drop_redone_steps(message.metrics)
            self.reported = True
            self.info.history.append(message.metrics)
            self.observer.report(message.metrics, self.info)
        elif isinstance(message, m.Started):
            self._on_started(rank, message)
        elif isinstance(message, m.CheckpointSaved):
            self.payload_kind[rank] = Payload.CHECKPOINT
        elif isinstance(message, m.WatchesCheckpoints):
            self.watched = True
        elif isinstance(message, m.Communication):
            self.info.communication = message.report
        elif isinstance(message, m.Result):
            if message.has_value:
                self.payload_kind[rank] = Payload.RESULT
                self.payload_bytes[rank] = message.nbytes
            else:
                self.results[rank] = None
        elif isinstance(message, m.RankError):
            self._on_error(message)
        elif isinstance(message, m.RankExited) and message.clean:
            self.losses.exited.add(rank)
        elif isinstance(message, m.RankExited):
            how = signal_name(message.signal) or (f"exit code {message.exit_code}" if message.exit_code is not None
                                                   else "exit status unknown: its warm parent did not say")
            fault = Fault(FaultKind.PROCESS_DIED, rank, self.losses.where(rank, message.host), how)
            self._fail(fault, WorkerFailed(
                f"The process of rank {rank} on {fault.host} died ({how}) before its function returned. "
                f"Every worker was stopped and the {self.lease.gpus:g} GPUs released.",
                rank=rank, node=fault.host, remote_type="ProcessDied", remote_message=how,
            ), collateral=False)

    def _drop_redone_steps(self, first: dict) -> None:
        """A restarted attempt resumes from the last checkpoint: the steps the failed attempt
        reported after it are done again, so their old reports leave the history (and count as
        lost), keeping one report per step across attempts."""
        step = first.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            return
        history = self.info.history
        kept = [r for r in history if not (isinstance(r.get("step"), (int, float)) and r["step"] >= step)]
        self.info.steps_lost += len(history) - len(kept)
        history[:] = kept

    def _on_started(self, rank: int, message: m.Started) -> None:
        self.started.add(rank)
        self.started_at[rank] = message.at
        self.info.rank_hosts[rank] = f"{message.host} ({message.address})" if message.address else message.host
        if len(self.started) == self.world_size:
            # when the ranks entered the function, not when this (maybe busy) kernel heard of it
            self.run_started = run_began(list(self.started_at.values()), launched=self.launched, heard=time.time())
            if self.attempt == 0:
                self.info.setup_s = self.run_started - (self.lease.granted_at or self.run_started)
            self.observer.running(self.info)

    def _on_error(self, error: m.RankError) -> None:
        collateral = _is_collateral(error)
        kind = FaultKind.COLLECTIVE if collateral else FaultKind.USER_ERROR
        fault = Fault(kind, error.rank, self.losses.where(error.rank, error.host), f"{error.type}: {error.message[:200]}",
                      error.mro)
        if LAUNCH_REFUSED in error.mro:  # the node's launcher would not start this user's rank: no user code ran
            self._fail(fault, LaunchRefused(f"{error.message} Every worker was stopped and the "
                                            f"{self.lease.gpus:g} GPUs released."), collateral=False)
            return
        self._fail(fault, WorkerFailed(
            f"Rank {error.rank} on {error.host} raised {error.type}: {error.message}. "
            f"Every worker was stopped and the {self.lease.gpus:g} GPUs released.",
            rank=error.rank, node=error.host, remote_type=error.type,
            remote_message=error.message, remote_traceback=error.traceback,
        ), collateral=collateral)

    def _payload_refused(self, rank: int, kind: Payload, exc: Exception) -> tuple[Fault, ResultTooLarge]:
        """Ray could not store what the rank sent (its node's object store is full and its disk
        too full to spill to): the same would happen again, so the run fails now, as a user error
        (never retried), saying what to do."""
        host = self.info.rank_hosts.get(rank) or self.losses.where(rank, "")
        size = self.payload_bytes.get(rank, 0)
        what = "result" if kind is Payload.RESULT else "checkpoint"
        said = f"Rank {rank}'s {what}" + (f" ({size / 1e6:,.0f} MB)" if size else "")
        fix = ("Return less: save big results to storage the notebook can read and return the path"
               if kind is Payload.RESULT else "Save less in gs.save_checkpoint, or write it to shared storage yourself")
        refused = "OutOfDiskError" if isinstance(exc, ray.exceptions.OutOfDiskError) else "ObjectStoreFullError"
        detail = f"{refused}: Ray's object store is full and the node's disk too full to spill to"
        fault = Fault(FaultKind.USER_ERROR, rank, host, f"ResultTooLarge: {detail}", ("gpusession.errors.ResultTooLarge",))
        return fault, ResultTooLarge(
            f"{said} did not fit in Ray's object store on {host} ({detail}). Every worker was stopped and the "
            f"{self.lease.gpus:g} GPUs released. {fix}, or give that node more object store memory "
            "(ray start --object-store-memory) or free disk space.",
            rank=rank, node=host, remote_type="ResultTooLarge", remote_message=detail)

    # ----- the broker's notice --------------------------------------------------------------------
    def _on_notice(self) -> Stopped | None:
        notice = self.lease.notice()
        if notice is None:  # the broker was replaced; the lease now watches the new one
            return None
        response = judge.respond_to_notice(notice.kind, graceful=bool(notice.deadline),
                                           commits=bool(self.checkpoints or self.watched
                                                        or self.info.checkpoint_ref is not None))
        if response is judge.NoticeResponse.RESIZE_AT_COMMIT:  # elastic: change size at the next commit
            why = notice.reason or notice.kind.value
            self.lease.crew.request_checkpoints(f"{notice.kind.value} to {notice.to_gpus} GPUs: {why}")
            self.resize_at_checkpoint = (deadline_to_act(notice, received=time.time()), notice)
            return None
        if notice.deadline and notice.kind in (NoticeKind.PREEMPT, NoticeKind.REVOKE):  # graceful, then forced
            why = "preempted" if notice.kind is NoticeKind.PREEMPT else "revoked"
            self.lease.crew.request_checkpoints(f"{why}: {notice.reason or ''}".strip())
        if response is judge.NoticeResponse.STOP_AT_COMMIT:
            # a function that commits stops at its next commit, or just before the broker takes
            # the GPUs; one that never does stops now, freeing them at once
            self.stop_at_checkpoint = (notice.deadline - 1.0, notice)
            return None
        return self._stopped(notice)

    def _stopped(self, notice: Notice) -> Stopped:
        return Stopped(notice_error(self.lease, notice, checkpointed=self.info.checkpoint_ref is not None))


def _store_refused(exc: Exception) -> bool:
    """PURE: Ray refused to store a stream item for lack of object store and disk (a RayTaskError
    of Ray's is also an instance of the error it wraps)."""
    return isinstance(exc, (ray.exceptions.ObjectStoreFullError, ray.exceptions.OutOfDiskError))


def _is_collateral(error: m.RankError) -> bool:
    """A collective that failed because a peer went away, rather than this rank's own error."""
    return is_collective_fault(error.type, error.message, error.traceback)
