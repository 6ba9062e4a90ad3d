"""What the trials table and summary say (pure), and how a trial's reports become Optuna's
intermediate values and pruning decisions (a real in-memory Optuna study, no cluster)."""
from __future__ import annotations

import threading

import optuna
import pytest

from gpusession.observe.events import RunInfo
from gpusession.sweeps.records import TrialRecord, TrialState
from gpusession.sweeps.table import plot_png, sorted_records, summary_line, table_rows
from gpusession.sweeps.trial import StopSignal, TrialObserver


def lower(a, b):
    return a < b


def record(number, best, state=TrialState.COMPLETE, **fields):
    r = TrialRecord(number=number, params={"lr": 0.1 * (number + 1)}, state=state, **fields)
    if best is not None:
        r.add_report({"step": 0, "val_loss": best}, "val_loss", better=lower)
    return r


def test_the_table_lists_the_best_objective_first_and_trials_without_one_last():
    records = [record(0, 0.5), record(1, None, TrialState.QUEUED), record(2, 0.2, TrialState.PRUNED), record(3, 0.9)]
    assert [r.number for r in sorted_records(records, mode_min=True)] == [2, 0, 3, 1]
    assert [r.number for r in sorted_records(records, mode_min=False)] == [3, 0, 2, 1]
    columns, rows = table_rows(records, objective="val_loss", mode_min=True)
    assert columns == ["trial", "lr", "last val_loss", "best val_loss", "step", "state", "GPU·s"]
    assert rows[0][:2] == ["2", "0.3"] and "pruned" in rows[0][5]
    assert rows[-1][2] == "" and "queued" in rows[-1][5]


def test_a_preempted_trial_says_so_in_its_row():
    r = record(0, 0.5, TrialState.RUNNING, preemptions=2)
    _, rows = table_rows([r], objective="val_loss", mode_min=True)
    assert rows[0][5] == "▶ running (2× preempted)"


def test_the_summary_counts_trials_and_names_the_best_complete_one():
    records = [record(0, 0.5, gpu_seconds=2.0), record(1, 0.1, TrialState.PRUNED, gpu_seconds=1.0),
               record(2, None, TrialState.RUNNING), record(3, None, TrialState.FAILED)]
    line = summary_line(records, budget=8, objective="val_loss", mode_min=True)
    assert line == ("3/8 trials done · 1 running · 0 waiting for GPUs · 1 pruned · 1 failed · "
                    "best val_loss 0.5 (trial 0) · 3.0 GPU·s")


def test_the_best_of_a_trial_follows_the_mode_and_its_last_value_is_the_latest_report():
    r = TrialRecord(number=0, params={})
    for step, value in enumerate([0.9, 0.4, 0.6]):
        r.add_report({"step": step, "val_loss": value, "acc": 0.5}, "val_loss", better=lower)
    r.add_report({"train_loss": 0.3}, "val_loss", better=lower)  # no objective: kept, not a point
    assert (r.value, r.best, r.step, r.reports, len(r.curve)) == (0.6, 0.4, 2, 4, 3)


def test_the_plot_draws_when_some_trial_has_a_curve():
    assert plot_png([record(0, None, TrialState.QUEUED)], objective="val_loss", mode_min=True) is None
    png = plot_png([record(0, 0.5), record(1, 0.2, TrialState.PRUNED)], objective="val_loss", mode_min=True)
    assert png.startswith(b"\x89PNG")


class Board:
    def __init__(self):
        self.changes = []

    def changed(self, r):
        self.changes.append(r.state)

    def output(self, r, rank, stream, text):
        pass


def observer_for(study, record_):
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    return trial, TrialObserver(record_, trial, objective="val_loss", better=lower, board=Board(),
                                stop=StopSignal(), optuna_lock=threading.Lock())


def test_reports_become_intermediate_values_and_a_repeated_step_counts_once():
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    trial, observer = observer_for(study, TrialRecord(number=0, params={}))
    for step, value in [(0, 0.9), (1, 0.5), (1, 0.7), (2, 0.4)]:  # step 1 again: a resumed run
        observer.report({"step": step, "val_loss": value}, RunInfo())
    assert study.trials[0].intermediate_values == {0: 0.9, 1: 0.5, 2: 0.4}


def test_a_trial_worse_than_the_median_is_pruned_by_raising_from_report():
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    for good in (0.1, 0.2):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.report(good, 0)
        study.tell(trial, good)
    record_ = TrialRecord(number=2, params={})
    _, observer = observer_for(study, record_)
    with pytest.raises(optuna.TrialPruned, match="trial 2 pruned at step 0"):
        observer.report({"step": 0, "val_loss": 5.0}, RunInfo())
    assert record_.pruned_at is not None


def test_a_stopped_sweep_makes_every_trials_poll_raise_keyboard_interrupt():
    stop = StopSignal()
    stop.check()  # nothing yet
    stop.set("failed")
    stop.check()  # max_failed lets running trials finish
    stop = StopSignal()
    stop.set("interrupted")
    with pytest.raises(KeyboardInterrupt):
        stop.check()
