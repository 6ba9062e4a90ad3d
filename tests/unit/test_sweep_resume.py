"""What a resumed sweep counts (a real SQLite Optuna storage; no cluster: nothing is run)."""
from __future__ import annotations

import optuna

import gpusession as gs
from gpusession.sweeps.plan import validate_sweep
from gpusession.sweeps.records import TrialRecord, TrialState
from gpusession.sweeps.runner import SweepRunner
from gpusession.sweeps.view import ConsoleBoard


def train(x):
    return x


def runner_for(storage: str, trials: int) -> SweepRunner:
    plan = validate_sweep(train, {"x": gs.uniform(0, 1)}, trials=trials, parallel=2, objective="val_loss",
                          mode="min", sampler="random", pruner=None, max_failed=3, priority="low",
                          storage=storage, study_name="resumed", seed=None, distributed_options={})
    study = optuna.create_study(storage=storage, study_name="resumed", load_if_exists=True,
                                sampler=plan.optuna_sampler())
    board = ConsoleBoard(objective="val_loss", mode_min=True, budget=plan.budget(), world_size=1)
    return SweepRunner(plan, study, board)


def test_a_resumed_sweep_runs_only_what_is_missing_and_closes_trials_a_dead_kernel_left_running(tmp_path):
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    study = optuna.create_study(storage=storage, study_name="resumed")
    distribution = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for value in (0.5, 0.2):
        study.tell(study.ask(distribution), value)
    study.tell(study.ask(distribution), state=optuna.trial.TrialState.PRUNED)
    study.tell(study.ask(distribution), state=optuna.trial.TrialState.FAIL)  # raised: it counts
    left_running = study.ask(distribution)  # the kernel died here

    runner = runner_for(storage, trials=6)

    assert runner.to_start == 2  # 6 asked for, 4 finished before
    states = {r.number: r.state for r in runner.records()}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.COMPLETE, 2: TrialState.PRUNED,
                      3: TrialState.FAILED, 4: TrialState.INTERRUPTED}
    reloaded = optuna.load_study(study_name="resumed", storage=storage)
    assert reloaded.trials[left_running.number].state == optuna.trial.TrialState.FAIL
    assert all(not r.ran_here for r in runner.records())
    assert runner_for(storage, trials=6).to_start == 2  # the closed one still does not count


def test_a_grid_sweep_records_its_last_grid_point_although_optuna_asks_the_study_to_stop():
    plan = validate_sweep(train, {"x": gs.choice([0.1, 0.2])}, trials=2, parallel=1, objective="val_loss",
                          mode="min", sampler="grid", pruner=None, max_failed=3, priority="low",
                          storage=None, study_name="grid", seed=0, distributed_options={})
    study = optuna.create_study(study_name="grid", sampler=plan.optuna_sampler())
    board = ConsoleBoard(objective="val_loss", mode_min=True, budget=plan.budget(), world_size=1)
    runner = SweepRunner(plan, study, board)
    for number in range(2):  # the second tell takes the grid's last point: GridSampler calls Study.stop
        trial = study.ask(plan.space.distributions())
        record = TrialRecord(number=trial.number, params=trial.params)
        record.value = trial.params["x"]
        runner._tell(trial, record, TrialState.COMPLETE, None)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert sorted(t.value for t in study.trials) == [0.1, 0.2]
