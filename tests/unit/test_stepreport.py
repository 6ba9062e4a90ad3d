"""The live step JupyterLab shows: the report's own step, or how many reports came."""
from __future__ import annotations

from gpusession.observe.events import RunInfo
from gpusession.run.caller.stepreport import step_of


def test_the_step_is_the_reports_own_whole_step_or_the_count_of_reports():
    info = RunInfo(history=[{"loss": 1.0}, {"loss": 0.5}, {"loss": 0.2}])
    assert step_of({"step": 340, "loss": 0.2}, info) == 340
    assert [step_of(m, info) for m in ({"loss": 0.2}, {"step": 2.5}, {"step": -1}, {"step": True})] == [3] * 4

