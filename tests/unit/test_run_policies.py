"""The run's pure decisions: what is retried, what fails at once, which state moves are allowed."""
from __future__ import annotations

import pytest

from gpusession.observe.events import RunInfo
from gpusession.run.caller.options import validate_run_options
from gpusession.run.caller.commits import last_step, resume_point
from gpusession.run.policies import (Action, Fault, FailurePolicy, FaultKind, RunState, can_move, is_collective_fault,
                                     restart_line, workers_after_host_loss)


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
    line = restart_line(fault(FaultKind.PROCESS_DIED), resume_step="the checkpoint after step 120", attempt=2,
                        max_attempts=4)
    assert line == ("rank 1 died on node-b (10.0.0.4) (SIGKILL): restarting from the checkpoint after step 120 "
                    "(attempt 2 of 4)")


def test_a_restart_names_the_checkpoint_by_the_step_reported_last_before_it_or_says_there_is_none():
    assert resume_point(RunInfo()) == "the start (no checkpoint yet)"
    assert resume_point(RunInfo(checkpoint_ref=object())) == "the last checkpoint"  # nothing reported a step
    assert resume_point(RunInfo(checkpoint_ref=object(), checkpoint_step=5)) == "the checkpoint after step 5"
    assert last_step([{"step": 4}, {"step": 5, "loss": 0.1}, {"loss": 0.2}, {"step": True}]) == 5
    assert last_step([{"loss": 0.2}]) is None


def test_a_lost_host_restart_line_names_the_host_and_every_rank_it_held():
    lost = Fault(FaultKind.HOST_LOST, rank=2, host="host2 (10.0.0.12, Ray node 3f2a1b0c9d8e)",
                 detail="silent for 5.0 s", ranks=(3, 2))
    after = "the checkpoint after step 7"
    assert restart_line(lost, resume_step=after, attempt=2, max_attempts=4) == (
        "host host2 (10.0.0.12, Ray node 3f2a1b0c9d8e) was lost (silent for 5.0 s) with ranks 2, 3: "
        "restarting from the checkpoint after step 7 (attempt 2 of 4)")
    assert restart_line(lost, resume_step=after, attempt=2, max_attempts=4, gpus=2).endswith(
        "restarting from the checkpoint after step 7 on 2 GPUs (attempt 2 of 4)")  # an elastic run going on smaller


def test_an_elastic_run_goes_on_with_the_workers_a_lost_host_left_never_below_its_minimum():
    assert workers_after_host_loss(4, 2, minimum=2) == 2
    assert workers_after_host_loss(4, 1, minimum=2) == 3
    assert workers_after_host_loss(4, 3, minimum=2) == 4  # too few left: the full size, moved elsewhere
    assert workers_after_host_loss(4, 2, minimum=None) == 4  # not elastic
    assert workers_after_host_loss(4, 0, minimum=2) == 4


@pytest.mark.parametrize("ours, asked, step", [
    ("gloo", "gloo", "KEEP"), ("gloo", "cpu:gloo", "KEEP"),
    ("nccl", "nccl", "KEEP"), ("nccl", "cuda:nccl", "KEEP"),
    ("nccl", "gloo", "NEW_GROUP"), ("gloo", "nccl", "NEW_GROUP"),
    ("nccl", "cpu:gloo,cuda:nccl", "NEW_GROUP"),  # gpusession's nccl group cannot reduce CPU tensors
])
def test_a_scripts_init_process_group_keeps_gpusessions_group_only_if_it_serves_the_backends_asked(ours, asked, step):
    from gpusession.run.rank.process_group import Step, backend_map, decide

    decision = decide(ours=backend_map(ours), wanted=backend_map(asked), own_rendezvous=False, ours_up=True)
    assert decision is Step[step]


def test_a_scripts_init_process_group_after_its_destroy_or_with_its_own_store_is_not_gpusessions_group():
    import torch

    from gpusession.run.rank.process_group import Step, backend_map, decide

    gloo = backend_map("gloo")
    assert decide(ours=gloo, wanted=gloo, own_rendezvous=False, ours_up=False) is Step.NEW_GROUP
    assert decide(ours=gloo, wanted=gloo, own_rendezvous=True, ours_up=True) is Step.OWN_RENDEZVOUS
    cpu_by_device = backend_map(None, device_id=torch.device("cpu"))  # torch's rule: the device's default
    assert decide(ours=gloo, wanted=cpu_by_device, own_rendezvous=False, ours_up=True) is Step.KEEP
    # No backend at all: torch's choice for this machine, the one gpusession makes on its real GPUs
    this_machine = backend_map("nccl" if torch.cuda.is_available() else "gloo")
    assert decide(ours=this_machine, wanted=backend_map(None), own_rendezvous=False, ours_up=True) is Step.KEEP


# ----- a collective that lost its peer, or the user's own error --------------------------------------
def _traceback(innermost: str) -> str:
    return ('Traceback (most recent call last):\n  File "/home/u/train.py", line 12, in train\n    step()\n'
            f'  File "{innermost}", line 40, in step\n    ...\nRuntimeError: x\n')


def test_torchs_distributed_errors_are_collective_faults():
    assert is_collective_fault("DistBackendError", "anything", _traceback("/home/u/train.py"))


def test_a_runtime_error_torch_raised_with_gloos_words_is_a_collective_fault():
    torch_frame = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    assert is_collective_fault("RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                               _traceback(torch_frame))


def test_a_runtime_error_the_user_raised_is_the_users_even_with_those_words():
    assert not is_collective_fault("RuntimeError", "data loader timed out", _traceback("/home/u/train.py"))


def test_a_runtime_error_from_torch_without_those_words_is_the_users():
    torch_frame = "/venv/lib/python3.11/site-packages/torch/nn/functional.py"
    assert not is_collective_fault("RuntimeError", "mat1 and mat2 shapes cannot be multiplied",
                                   _traceback(torch_frame))


def test_an_illegal_run_move_raises_and_a_legal_one_returns_the_target():
    from gpusession.run.policies import IllegalRunMove, check_move

    assert check_move(RunState.RUNNING, RunState.RESIZING) is RunState.RESIZING
    with pytest.raises(IllegalRunMove, match="from finished to running"):
        check_move(RunState.FINISHED, RunState.RUNNING)
