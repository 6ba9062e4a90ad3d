"""PURE: what a run does when an attempt fails, and the states a run moves through.

No Ray, no clock, no I/O: the controller describes what happened as a Fault and applies the
decision it gets back. Tested without a cluster (tests/unit/test_run_policies.py).
"""
from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass


class RunState(enum.Enum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    RESIZING = "resizing"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    PREEMPTED = "preempted"

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED)


_ALLOWED = {
    RunState.QUEUED: {RunState.STARTING, RunState.FAILED, RunState.STOPPED},
    RunState.STARTING: {RunState.RUNNING, RunState.RESTARTING, RunState.FAILED, RunState.STOPPED,
                        RunState.PREEMPTED},
    RunState.RUNNING: {RunState.FINISHED, RunState.RESTARTING, RunState.RESIZING, RunState.FAILED,
                       RunState.STOPPED, RunState.PREEMPTED},
    RunState.RESTARTING: {RunState.STARTING, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED},
    RunState.RESIZING: {RunState.STARTING, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED},
}


def can_move(current: RunState, target: RunState) -> bool:
    return target in _ALLOWED.get(current, set())


class IllegalRunMove(RuntimeError):
    """The controller tried a state move a run cannot make: a bug in gpusession, never the user's."""


def check_move(current: RunState, target: RunState) -> RunState:
    """`target`, if a run may move there from `current`; else IllegalRunMove (as the broker's
    lease states do)."""
    if not can_move(current, target):
        raise IllegalRunMove(f"A run cannot move from {current.value} to {target.value}.")
    return target


class FaultKind(enum.Enum):
    USER_ERROR = "user error"  # the user's code raised: a bug, not a fault of the cluster
    PROCESS_DIED = "process died"  # a rank's process ended without a result (killed, OOM, segfault)
    WORKER_LOST = "worker lost"  # a rank's worker actor went away (its host still answers)
    HOST_LOST = "host lost"  # a host died or went silent: every rank on it is gone
    COLLECTIVE = "collective failed"  # a collective lost its peer or timed out

    @property
    def is_fault(self) -> bool:
        return self is not FaultKind.USER_ERROR


# torch.distributed's own errors when a peer went away or a collective timed out
_COLLECTIVE_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")
# what gloo and nccl say in a plain RuntimeError raised inside torch (an older torch, DDP's backward)
_COLLECTIVE_WORDS = ("connection closed", "connection reset", "broken pipe", "socket timeout",
                     "gloo/transport", "nccl communicator was aborted", "timed out")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)


def is_collective_fault(error_type: str, message: str, traceback_text: str) -> bool:
    """A rank's exception that says a collective lost its peer (a fault, retried), not a bug in
    the user's code (failed at once). torch's distributed error types always are; a RuntimeError
    only when torch itself raised it (its innermost frame is in torch) with gloo's or nccl's words:
    a user's own `raise RuntimeError("... timed out")` is the user's."""
    if error_type in _COLLECTIVE_TYPES:
        return True
    if error_type != "RuntimeError" or not any(word in message.lower() for word in _COLLECTIVE_WORDS):
        return False
    frames = _FRAME.findall(traceback_text)
    return bool(frames) and "/torch/" in frames[-1].replace("\\", "/")


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    rank: int
    host: str
    detail: str  # "SIGKILL", "ValueError: bad lr", ...
    exception_names: tuple[str, ...] = ()  # qualified names of the raised exception's classes
    ranks: tuple[int, ...] = ()  # every rank the fault took (a lost host's), if more than `rank`


class Action(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


@dataclass(frozen=True)
class FailureDecision:
    action: Action
    why: str


@dataclass(frozen=True)
class FailurePolicy:
    """Faults are retried up to `max_failures` times; user errors fail at once unless the user
    asked to retry them (`retry_exceptions=True`, or names of exception classes)."""

    max_failures: int
    retry_exceptions: bool | tuple[str, ...] = False

    def decide(self, fault: Fault, failures_so_far: int) -> FailureDecision:
        if not fault.kind.is_fault and not self._retries(fault):
            return FailureDecision(Action.RAISE, "an exception in user code is not retried "
                                                 "(pass retry_exceptions= to retry it)")
        if failures_so_far >= self.max_failures:
            return FailureDecision(Action.RAISE, f"max_failures={self.max_failures} reached")
        return FailureDecision(Action.RETRY, f"failure {failures_so_far + 1} of at most {self.max_failures}")

    def _retries(self, fault: Fault) -> bool:
        if self.retry_exceptions is True:
            return True
        if not self.retry_exceptions:
            return False
        return any(_matches(name, fault.exception_names) for name in self.retry_exceptions)


def _matches(wanted: str, names: tuple[str, ...]) -> bool:
    """`wanted` is a qualified class name ("builtins.ValueError", "mypkg.Flaky") or a bare one."""
    return any(name == wanted or name.rsplit(".", 1)[-1] == wanted for name in names)


def signal_name(number: int | None) -> str:
    if number is None:
        return ""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def restart_line(fault: Fault, *, resume_step: str, attempt: int, max_attempts: int,
                 gpus: float | None = None) -> str:
    """The cell's line for a restart, e.g. "rank 3 died on node 10.0.0.4 (SIGKILL): restarting
    from the checkpoint after step 120 (attempt 2 of 4)" (`resume_step`: "the checkpoint after
    step 120"); `gpus`: an elastic run restarting smaller ("... after step 120 on 2 GPUs
    (attempt 2 of 4)")."""
    on = f" on {gpus:g} GPUs" if gpus is not None else ""
    then = f"restarting from {resume_step}{on} (attempt {attempt} of {max_attempts})"
    if fault.kind is FaultKind.HOST_LOST:
        return f"host {fault.host} was lost ({fault.detail}) with {ranks_text(fault.ranks or (fault.rank,))}: {then}"
    what = {
        FaultKind.PROCESS_DIED: "died",
        FaultKind.WORKER_LOST: "was lost",
        FaultKind.COLLECTIVE: "lost its peers",
        FaultKind.USER_ERROR: "raised",
    }[fault.kind]
    return f"rank {fault.rank} {what} on {fault.host} ({fault.detail}): {then}"


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def workers_after_host_loss(size: int, lost: int, minimum: int | None) -> int:
    """PURE: the workers a run restarts with after a lost host took `lost` of its `size`: an
    elastic run (`minimum` below size) goes on with those that survived, if at least `minimum`
    (their GPUs are the lease's already: nothing to wait for); otherwise the full size, for which
    the broker must find the lost host's share free on other hosts (broker/policy/relocation.py)."""
    survivors = size - lost
    if minimum is not None and minimum < size and lost > 0 and survivors >= minimum:
        return survivors
    return size


def run_began(rank_times: list[float], *, launched: float, heard: float) -> float:
    """When every rank was running the function: the last rank's own timestamp (a loaded kernel
    may hear of it seconds later), kept within [launched, heard] (another host's clock may be off)."""
    return min(max(max(rank_times), launched), heard)
