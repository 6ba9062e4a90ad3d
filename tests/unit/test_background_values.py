"""Pure parts of background runs: the handle's state moves, a run's end, when a run began."""
from __future__ import annotations

import pytest

from gpusession.errors import RunCancelled, WorkerFailed
from gpusession.notebook.bgcell import pull_note
from gpusession.api.background import IllegalMove, RunStatus, ended_status, next_status
from gpusession.run.policies import run_began


def test_a_run_moves_forward_and_an_illegal_move_raises():
    assert next_status(RunStatus.SUBMITTED, RunStatus.QUEUED) is RunStatus.QUEUED
    assert next_status(RunStatus.RUNNING, RunStatus.STARTING) is RunStatus.STARTING  # a restart
    assert next_status(RunStatus.RUNNING, RunStatus.RUNNING) is RunStatus.RUNNING
    with pytest.raises(IllegalMove, match="from finished to running"):
        next_status(RunStatus.FINISHED, RunStatus.RUNNING)
    with pytest.raises(IllegalMove):
        next_status(RunStatus.QUEUED, RunStatus.RUNNING)


def test_a_runs_end_is_finished_cancelled_or_failed():
    assert ended_status(None) is RunStatus.FINISHED
    assert ended_status(RunCancelled("x")) is RunStatus.CANCELLED
    assert ended_status(WorkerFailed("x")) is RunStatus.FAILED
    assert ended_status(KeyboardInterrupt()) is RunStatus.FAILED
    assert all(s.is_terminal for s in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED))
    assert not RunStatus.RUNNING.is_terminal


def test_a_run_began_when_its_last_rank_entered_the_function_not_when_the_kernel_heard():
    assert run_began([10.0, 10.4], launched=9.0, heard=15.0) == 10.4  # a busy kernel heard 4.6 s late
    assert run_began([3.0], launched=9.0, heard=15.0) == 9.0  # a host clock behind: not before the launch
    assert run_began([30.0], launched=9.0, heard=15.0) == 15.0  # a host clock ahead: not after it was heard


def test_the_pull_note_names_the_handle_and_the_names():
    assert pull_note("r1", ("model", "loss")) == (
        "gpusession: run 'r1' finished; its names (model, loss) are not in the notebook yet: r1.pull() assigns them.")
    assert "r1.pull() returns its last expression's value" in pull_note("r1", ())
