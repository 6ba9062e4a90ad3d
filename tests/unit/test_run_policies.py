"""The run's pure decisions: what is retried, what fails at once, which state moves are allowed."""
from __future__ import annotations

import pytest

from gpusession.options import validate_run_options
from gpusession.run.policies import (Action, Fault, FailurePolicy, FaultKind, RunState, can_move, restart_line,
                                     workers_after_host_loss)


def fault(kind: FaultKind, names: tuple[str, ...] = ()) -> Fault:
    return Fault(kind, rank=1, host="node-b (10.0.0.4)", detail="SIGKILL", exception_names=names)


@pytest.mark.parametrize("kind", [FaultKind.PROCESS_DIED, FaultKind.WORKER_LOST, FaultKind.HOST_LOST,
                                  FaultKind.COLLECTIVE])
def test_faults_are_retried_until_max_failures_then_raised(kind):
    policy = FailurePolicy(max_failures=2)
    assert policy.decide(fault(kind), 0).action is Action.RETRY
    assert policy.decide(fault(kind), 1).action is Action.RETRY
    decision = policy.decide(fault(kind), 2)
    assert decision.action is Action.RAISE and "max_failures=2" in decision.why


def test_an_exception_in_user_code_is_raised_at_once_even_with_failures_left():
    decision = FailurePolicy(max_failures=3).decide(fault(FaultKind.USER_ERROR, ("builtins.ValueError",)), 0)
    assert decision.action is Action.RAISE and "retry_exceptions" in decision.why


def test_retry_exceptions_true_retries_any_user_exception_within_max_failures():
    policy = FailurePolicy(max_failures=1, retry_exceptions=True)
    error = fault(FaultKind.USER_ERROR, ("builtins.ValueError", "builtins.Exception"))
    assert policy.decide(error, 0).action is Action.RETRY
    assert policy.decide(error, 1).action is Action.RAISE


def test_retry_exceptions_matches_the_raised_class_or_any_base_class_by_name():
    options = validate_run_options(retry_exceptions=(OSError,))
    policy = FailurePolicy(max_failures=3, retry_exceptions=options.retry_exceptions)
    timeout = fault(FaultKind.USER_ERROR, ("builtins.TimeoutError", "builtins.OSError", "builtins.Exception"))
    value = fault(FaultKind.USER_ERROR, ("builtins.ValueError", "builtins.Exception"))
    assert policy.decide(timeout, 0).action is Action.RETRY  # TimeoutError is an OSError
    assert policy.decide(value, 0).action is Action.RAISE


@pytest.mark.parametrize("bad", [(1,), ("ValueError",), (), [ValueError], int, 3])
def test_retry_exceptions_refuses_what_is_not_exception_classes(bad):
    with pytest.raises(TypeError, match="retry_exceptions must be True, False, an exception class"):
        validate_run_options(retry_exceptions=bad)


def test_max_failures_zero_raises_the_first_fault():
    assert FailurePolicy(max_failures=0).decide(fault(FaultKind.PROCESS_DIED), 0).action is Action.RAISE


def test_terminal_states_are_final_and_a_run_restarts_only_through_restarting():
    assert all(s.is_terminal for s in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED))
    assert not any(can_move(RunState.FINISHED, target) for target in RunState)
    assert can_move(RunState.RUNNING, RunState.RESTARTING) and can_move(RunState.RESTARTING, RunState.STARTING)
    assert not can_move(RunState.RUNNING, RunState.STARTING)
    assert not can_move(RunState.QUEUED, RunState.RUNNING)


def test_the_restart_line_names_the_rank_the_host_the_cause_and_the_attempt():
    line = restart_line(fault(FaultKind.PROCESS_DIED), resume_step="step 120", attempt=2, max_attempts=4)
    assert line == "rank 1 died on node-b (10.0.0.4) (SIGKILL): restarting from step 120 (attempt 2 of 4)"


def test_a_lost_host_restart_line_names_the_host_and_every_rank_it_held():
    lost = Fault(FaultKind.HOST_LOST, rank=2, host="host2 (10.0.0.12, Ray node 3f2a1b0c9d8e)",
                 detail="silent for 5.0 s", ranks=(3, 2))
    assert restart_line(lost, resume_step="step 7", attempt=2, max_attempts=4) == (
        "host host2 (10.0.0.12, Ray node 3f2a1b0c9d8e) was lost (silent for 5.0 s) with ranks 2, 3: "
        "restarting from step 7 (attempt 2 of 4)")
    assert restart_line(lost, resume_step="step 7", attempt=2, max_attempts=4, gpus=2).endswith(
        "restarting from step 7 on 2 GPUs (attempt 2 of 4)")  # an elastic run going on smaller


def test_an_elastic_run_goes_on_with_the_workers_a_lost_host_left_never_below_its_minimum():
    assert workers_after_host_loss(4, 2, minimum=2) == 2
    assert workers_after_host_loss(4, 1, minimum=2) == 3
    assert workers_after_host_loss(4, 3, minimum=2) == 4  # too few left: the full size, moved elsewhere
    assert workers_after_host_loss(4, 2, minimum=None) == 4  # not elastic
    assert workers_after_host_loss(4, 0, minimum=2) == 4

