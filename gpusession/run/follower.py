"""Follow one attempt: every rank's message stream and the broker's notice, in one loop.

One loop in the caller's thread waits on all ranks' streams and the broker's notice at once
(ray.wait), so output and metrics arrive as they happen, Ctrl-C is noticed within a poll, and
the first failing rank ends the attempt. `follow()` returns how the attempt ended as a value
(outcome.py); the controller then stops every other rank (they may be stuck in a collective)
and decides whether to restart. The judgements (root cause, host or worker, the clock) are pure
functions in judgements.py.
"""
from __future__ import annotations

import enum
import logging
import time
from typing import Any

import ray

from ..errors import RunTimeout, WorkerFailed
from ..events import Observer, RunInfo
from . import commits, judgements as judge, messages as m
from .heartbeat import BeatMonitor, Loss
from .notices import notice_error
from ..broker.notice import Notice, NoticeKind
from ..cluster.raycluster import node_answers
from .outcome import AttemptEnd, Failed, Finished, Resize, Stopped, TimedOut
from .policies import Fault, FaultKind, is_collective_fault, ranks_text, run_began, signal_name
from .resize import deadline_to_act

POLL_S = 0.2  # how often the loop looks at the clock when no rank says anything
FAILURE_GRACE_S = 1.0  # after a rank's communication error, how long to wait for the root cause
DRAIN_S = 0.3  # after a failure, how long to keep taking what the other ranks already sent
LOSS_GATHER_S = 0.15  # after a first lost heartbeat, how long the host's other ranks have to report theirs
NODE_ANSWER_TIMEOUT_S = 0.3  # is the host of a lost worker still there? (its raylet's port)
# A worker lost while its host still answers is judged after this: the processes of a host that
# dies do not all go at once (seen under load: a worker gone, its raylet still answering), so the
# host is asked again before the loss is called one worker's.
HOST_SETTLE_S = 1.0


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
        self.rank_nodes = {spec.rank: spec.address for spec, _, _ in ranks}
        self.rank_node_ids = {spec.rank: spec.node_id for spec, _, _ in ranks}
        self.rank_workers = {spec.rank: worker for spec, _, worker in ranks}
        self.beats = _monitor(self.rank_workers, silence_s) if silence_s else None
        self.pending_losses: dict[int, Loss] = {}
        self.lost_nodes: dict[str, str] = {}  # Ray node id -> "host (ip, Ray node id)" of hosts lost
        self.world_size = len(ranks)
        self.run_id = ranks[0][0].run_id if ranks else None
        self.deadline, self.timeout_s, self.attempt = deadline, timeout_s, attempt
        self.launched = launched
        self.payload_kind: dict[int, Payload] = {}
        self.results: dict[int, Any] = {}
        self.started: set[int] = set()
        self.started_at: dict[int, float] = {}  # rank -> its own clock when it entered the function
        self.run_started: float | None = None
        self.checkpoints = 0
        self.watched = False  # rank 0 called gs.should_checkpoint(): it commits when asked
        self.reported = False  # this attempt's first report marks where it resumed
        self.stop_at_checkpoint: tuple[float, dict] | None = None
        self.resize_at_checkpoint: tuple[float, dict] | None = None  # (act by, shrink or grow notice)
        self.failures: list[tuple[bool, Fault, WorkerFailed]] = []  # (collateral, fault, error)
        self.failing_since: float | None = None
        self.lost_ranks: set[int] = set()  # ranks whose worker actor died
        self.suspects: dict[str, tuple[float, list[Loss]]] = {}  # node -> (since, losses) while its host answers
        self.exited: set[int] = set()  # ranks whose process ended after its result or error

    def follow(self) -> AttemptEnd:
        """Follow the attempt to its end: how it ended, as a value."""
        try:
            return self._follow()
        finally:  # a failed or interrupted run still says how long the function ran
            if self.beats is not None:
                self.beats.close()
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
            self._check_heartbeats()
            self._settle_suspects()
            end = self._check_failures() or self._check_clocks()
            if end is not None:
                return end
            self.observer.poll()  # the user's own stop (interrupt, cancel) raises here
        self._settle_suspects(wait=True)
        end = self._check_failures()
        if end is not None:
            return end
        return Finished({rank: ray.get(ref).data if ref is not None else None for rank, ref in self.results.items()})

    # ----- failures -------------------------------------------------------------------------------
    def _fail(self, fault: Fault, error: WorkerFailed, *, collateral: bool) -> None:
        self.failures.append((collateral, fault, error))
        self.failing_since = self.failing_since or time.monotonic()

    def _check_failures(self) -> AttemptEnd | None:
        """End the attempt on the root cause (judgements.root_cause)."""
        if not self.failures or self.suspects:  # a suspect is judged first: it may be the root cause
            return None
        chosen = judge.root_cause([judge.Failure(c, i) for i, (c, _, _) in enumerate(self.failures)],
                                  waited_s=time.monotonic() - self.failing_since, grace_s=FAILURE_GRACE_S,
                                  ranks_left=len(self.streams))
        if chosen is None:
            return None
        end = self._drain(DRAIN_S)
        if end is not None:  # the commit just taken is where the run was to stop or resize anyway
            return end
        collateral, fault, error = self.failures[chosen]
        others = [e for _, _, e in self.failures if e is not error]
        if collateral and others:  # no root cause found: show what every rank reported
            error.args = (error.args[0] + " Other ranks: " + "; ".join(
                f"rank {e.rank}: {e.remote_type}: {(e.remote_message or '')[:300]}" for e in others),)
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
            self._lost(rank, exc)
            return None
        kind = self.payload_kind.pop(rank, None)
        if kind is Payload.CHECKPOINT:
            try:
                held = commits.hold(ref)
            except ray.exceptions.RayError as exc:  # lost with rank 0's node before it reached us
                del self.streams[stream]
                self._lost(rank, exc)
                return None
            return self._commit(rank, held)
        if kind is Payload.RESULT:
            self.results[rank] = ref
            return None
        try:
            message = ray.get(ref)
        except ray.exceptions.RayError as exc:
            del self.streams[stream]
            self._lost(rank, exc)
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
            else:
                self.results[rank] = None
        elif isinstance(message, m.RankError):
            self._on_error(message)
        elif isinstance(message, m.RankExited) and message.clean:
            self.exited.add(rank)
        elif isinstance(message, m.RankExited):
            how = signal_name(message.signal) or f"exit code {message.exit_code}"
            fault = Fault(FaultKind.PROCESS_DIED, rank, self._where(rank, message.host), how)
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
        fault = Fault(kind, error.rank, self._where(error.rank, error.host), f"{error.type}: {error.message[:200]}",
                      error.mro)
        self._fail(fault, WorkerFailed(
            f"Rank {error.rank} on {error.host} raised {error.type}: {error.message}. "
            f"Every worker was stopped and the {self.lease.gpus:g} GPUs released.",
            rank=error.rank, node=error.host, remote_type=error.type,
            remote_message=error.message, remote_traceback=error.traceback,
        ), collateral=collateral)

    def _lost(self, rank: int, exc: Exception) -> None:
        """Ray reports the rank's worker actor dead: the same judgement as a lost heartbeat."""
        if rank in self.lost_ranks:  # its host was already judged lost
            return
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        how = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        if rank in self.pending_losses:  # its heartbeat said it first, and says it better
            how = self.pending_losses.pop(rank).how
        self._blame(self.rank_node_ids.get(rank, ""), [Loss(rank, how, time.time())])

    def _where(self, rank: int, host: str) -> str:
        address = self.rank_nodes.get(rank) or ""
        if host and address:
            return f"{host} ({address})"
        return host or address or "?"

    # ----- heartbeats: a lost worker or host, told apart from the echoes of its loss ------------------
    def _check_heartbeats(self) -> None:
        if self.beats is None:
            return
        for loss in self.beats.take_losses():
            if loss.key not in self.exited and loss.key not in self.lost_ranks:  # a rank that ended lost nothing
                self.pending_losses[loss.key] = loss
        if not self.pending_losses:
            return
        first = min(loss.at for loss in self.pending_losses.values())
        if not judge.losses_gathered(first, time.time(), LOSS_GATHER_S):
            return  # the other ranks of that host report theirs within moments
        losses, self.pending_losses = self.pending_losses, {}
        by_node: dict[str, list[Loss]] = {}
        for rank, loss in sorted(losses.items()):
            if rank in self.lost_ranks:  # judged meanwhile, when Ray reported its worker dead
                continue
            by_node.setdefault(self.rank_node_ids.get(rank, ""), []).append(loss)
        for node_id, node_losses in by_node.items():
            self._blame(node_id, node_losses)

    def _settle_suspects(self, *, wait: bool = False) -> None:
        """Judge the workers lost while their host answered, once HOST_SETTLE_S has passed (wait:
        the attempt is over, so wait for that now)."""
        for node_id, (since, losses) in list(self.suspects.items()):
            left = since + HOST_SETTLE_S - time.monotonic()
            if left > 0 and not wait:
                continue
            time.sleep(max(0.0, left))
            del self.suspects[node_id]
            self._blame(node_id, losses, settled=True)

    def _blame(self, node_id: str, losses: list[Loss], *, settled: bool = False) -> None:
        how = losses[0].how
        answers = bool(node_id) and node_answers(node_id, NODE_ANSWER_TIMEOUT_S)
        whom = judge.blame(node_known=bool(node_id), host_answers=answers, settled=settled)
        if whom is judge.Blame.HOST:
            self.suspects.pop(node_id, None)
            ranks = tuple(sorted(r for r, n in self.rank_node_ids.items() if n == node_id))
            host = self._host_name(ranks[0], node_id)
            self.lost_ranks.update(ranks)
            self.lost_nodes[node_id] = host
            fault = Fault(FaultKind.HOST_LOST, ranks[0], self._host_name(ranks[0], node_id[:12]), how, ranks=ranks)
            self._fail(fault, WorkerFailed(
                f"Host {host} was lost ({how}) with {ranks_text(ranks)}. The ranks on the other hosts were "
                f"stopped and every GPU of the lease released.",
                rank=ranks[0], node=self._where(ranks[0], ""), remote_type="HostLost", remote_message=how,
            ), collateral=False)
            return
        if whom is judge.Blame.SUSPECT:  # the host answers, for now: ask it again in a moment
            since, earlier = self.suspects.get(node_id, (time.monotonic(), []))
            self.suspects[node_id] = (since, earlier + losses)
            self.lost_ranks.update(loss.key for loss in losses)
            return
        for loss in losses:  # the host still answers: only these workers went (an actor killed)
            rank = loss.key
            self.lost_ranks.add(rank)
            where = self._where(rank, self._worker_host(rank))
            self._fail(Fault(FaultKind.WORKER_LOST, rank, where, loss.how), WorkerFailed(
                f"The worker of rank {rank} on {where} was lost ({loss.how}). Every worker was stopped and the "
                f"{self.lease.gpus:g} GPUs released.",
                rank=rank, node=where, remote_type="WorkerLost", remote_message=loss.how,
            ), collateral=False)

    def _worker_host(self, rank: int) -> str:
        worker = self.rank_workers.get(rank)
        return (getattr(worker, "info", None) or {}).get("host", "")

    def _host_name(self, rank: int, node_id: str) -> str:
        name, address = self._worker_host(rank), self.rank_nodes.get(rank, "")
        return f"{name or '?'} ({address}, Ray node {node_id})"

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


def _monitor(rank_workers: dict, silence_s: float) -> BeatMonitor | None:
    targets = {}
    for rank, worker in rank_workers.items():
        info = getattr(worker, "info", None) or {}
        if info.get("beat_port"):
            targets[rank] = (info["address"], info["beat_port"])
    if not targets:
        return None
    monitor = BeatMonitor(targets, silence_s)
    if monitor.unwatched:
        logging.getLogger("gpusession").warning(
            "No heartbeat from the workers of ranks %s (%s): a lost host is noticed only when Ray declares it "
            "dead. Let the caller reach the worker nodes on every TCP port (README, Multi-host clusters).",
            sorted(monitor.unwatched), "; ".join(sorted(set(monitor.unwatched.values()))))
    return monitor


def _is_collateral(error: m.RankError) -> bool:
    """A collective that failed because a peer went away, rather than this rank's own error."""
    return is_collective_fault(error.type, error.message, error.traceback)
