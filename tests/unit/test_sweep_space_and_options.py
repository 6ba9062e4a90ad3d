"""gs.sweep's arguments: the search space in plain values, and every mistake caught before
anything is leased (no Ray needed: these raise before a cluster is even looked for)."""
from __future__ import annotations

import optuna
import pytest

import gpusession as gs
from gpusession.broker.policy.model import Priority
from gpusession.sweeps.plan import validate_sweep
from gpusession.sweeps.space import parse_space


def train(lr, width, epochs=3):
    return lr


def plan_of(fn=train, space=None, **overrides):
    arguments = dict(trials=16, parallel=4, objective="val_loss", mode="min", sampler="tpe", pruner="asha",
                     max_failed=3, priority="low", storage=None, study_name=None, seed=None, distributed_options={})
    arguments.update(overrides)
    return validate_sweep(fn, space or {"lr": gs.loguniform(1e-4, 1e-1), "width": gs.choice([32, 64])}, **arguments)


def test_each_distribution_becomes_the_matching_optuna_distribution():
    space = parse_space({"lr": gs.loguniform(1e-4, 1e-1), "dropout": gs.uniform(0.0, 0.5),
                         "width": gs.choice([32, 64]), "layers": gs.randint(1, 4), "epochs": 3})
    dists = space.distributions()
    assert dists["lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert dists["dropout"] == optuna.distributions.FloatDistribution(0.0, 0.5)
    assert dists["width"] == optuna.distributions.CategoricalDistribution((32, 64))
    assert dists["layers"] == optuna.distributions.IntDistribution(1, 4)
    assert space.fixed == {"epochs": 3}  # plain values are passed to every trial as they are


def test_a_trial_gets_the_sampled_values_and_the_constants():
    space = parse_space({"lr": gs.uniform(0.1, 0.2), "epochs": 3})
    study = optuna.create_study()
    trial = study.ask(space.distributions())
    params = space.params_of(trial)
    assert params["epochs"] == 3 and 0.1 <= params["lr"] <= 0.2


@pytest.mark.parametrize("make, message", [
    (lambda: gs.uniform(1.0, 0.5), "low < high"),
    (lambda: gs.loguniform(0.0, 1.0), "0 < low"),
    (lambda: gs.choice([]), "at least one value"),
    (lambda: gs.choice("abc"), "list of values"),
    (lambda: gs.choice([object()]), "numbers, strings"),
    (lambda: gs.randint(1.5, 3), "whole number"),
    (lambda: gs.randint(5, 3), "low <= high"),
    (lambda: gs.uniform("a", 1), "finite number"),
])
def test_a_bad_distribution_is_refused_with_what_to_write(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("overrides, error, message", [
    (dict(trials=0), ValueError, "trials must be a whole number >= 1"),
    (dict(parallel=2.5), ValueError, "parallel must be"),
    (dict(mode="best"), ValueError, "mode must be 'min' or 'max'"),
    (dict(sampler="bayes"), ValueError, "sampler must be"),
    (dict(pruner="hyperband"), ValueError, "pruner must be"),
    (dict(max_failed=0), ValueError, "max_failed"),
    (dict(objective=""), TypeError, "objective must be"),
    (dict(priority="urgent"), ValueError, "priority must be one of"),
    (dict(storage=42), TypeError, "storage must be an Optuna storage"),
    (dict(distributed_options={"gpu": 2}), TypeError, "unknown option 'gpu'"),
    (dict(distributed_options={"gpus": 3, "gpus_per_worker": 2}), ValueError, "whole multiple"),
])
def test_bad_sweep_arguments_raise_naming_the_argument(overrides, error, message):
    with pytest.raises(error, match=message):
        plan_of(**overrides)


def test_gs_sweep_refuses_bad_input_before_looking_for_a_cluster():
    with pytest.raises(ValueError, match="nothing to search"):
        gs.sweep(train, {"lr": 0.1, "width": 64})
    with pytest.raises(TypeError, match="space must be a dict"):
        gs.sweep(train, [gs.uniform(0, 1)])
    with pytest.raises(ValueError, match="argument names"):
        gs.sweep(train, {"not a name": gs.uniform(0, 1)})


def test_grid_search_needs_finite_choices_and_runs_at_most_the_grid():
    with pytest.raises(ValueError, match="sampler='grid' needs finite choices"):
        plan_of(sampler="grid", space={"lr": gs.uniform(0.1, 0.2)})
    plan = plan_of(sampler="grid", space={"width": gs.choice([32, 64]), "layers": gs.randint(1, 3)})
    assert plan.budget() == 6  # 2 x 3 points, although trials=16
    assert isinstance(plan.optuna_sampler(), optuna.samplers.GridSampler)


def test_samplers_and_pruners_are_optunas_own():
    assert isinstance(plan_of(sampler="tpe").optuna_sampler(), optuna.samplers.TPESampler)
    assert isinstance(plan_of(sampler="random").optuna_sampler(), optuna.samplers.RandomSampler)
    assert isinstance(plan_of(pruner="asha").optuna_pruner(), optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(plan_of(pruner="median").optuna_pruner(), optuna.pruners.MedianPruner)
    assert isinstance(plan_of(pruner=None).optuna_pruner(), optuna.pruners.NopPruner)
    mine = optuna.pruners.PercentilePruner(25.0)
    assert plan_of(pruner=mine).optuna_pruner() is mine


def test_a_plain_function_runs_with_the_sweeps_options_at_the_sweeps_priority():
    plan = plan_of(distributed_options={"gpus": 2, "timeout": "10m"})
    assert plan.run_options.lease.gpus == 2 and plan.run_options.timeout_s == 600
    assert plan.run_options.lease.priority is Priority.LOW
    assert plan.run_options.lease.sweep_id == plan.study_name


def test_a_decorated_function_keeps_its_own_options_and_refuses_others():
    decorated = gs.distributed(gpus=2, timeout=60)(train)
    plan = plan_of(fn=decorated, priority="normal")
    assert plan.fn is train and plan.run_options.lease.gpus == 2 and plan.run_options.timeout_s == 60
    assert plan.run_options.lease.priority is Priority.NORMAL
    with pytest.raises(TypeError, match="already @gs.distributed"):
        plan_of(fn=decorated, distributed_options={"gpus": 4})


def test_the_same_call_names_the_same_study_and_a_changed_space_another():
    first, again = plan_of(), plan_of(trials=32)  # more trials continue the same study
    other = plan_of(space={"lr": gs.loguniform(1e-5, 1e-1), "width": gs.choice([32, 64])})
    assert first.study_name == again.study_name and first.study_name.startswith("sweep-train-")
    assert other.study_name != first.study_name
    assert plan_of(study_name="mine").study_name == "mine"


def test_a_study_name_does_not_depend_on_where_a_constant_object_lives_in_memory():
    space = {"lr": gs.uniform(0.1, 0.2), "data": object()}
    again = {"lr": gs.uniform(0.1, 0.2), "data": object()}  # as after a kernel restart
    assert plan_of(space=space).study_name == plan_of(space=again).study_name
