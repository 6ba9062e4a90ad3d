"""`gs.sweep`: search hyperparameters with Optuna, one lease per trial, only while trials run."""
from __future__ import annotations

from typing import Any, Callable

from .plan import SweepPlan, validate_sweep
from .result import BestTrial, SweepFailed, SweepResult
from .runner import SweepRunner
from .trial import StopReason
from .view import make_board


def sweep(train: Callable, space: Any, *, trials: int = 16, parallel: int = 4, objective: str = "val_loss",
          mode: str = "min", sampler: Any = "tpe", pruner: Any = "asha", max_failed: int = 3,
          priority: str = "low", storage: Any = None, study_name: str | None = None, seed: int | None = None,
          **distributed_options: Any) -> SweepResult:
    """Search `space` for the arguments of `train` that make its reported `objective` best.

    In [1]: def train(lr, width, epochs=8):
       ...:     for epoch in range(epochs):
       ...:         ...
       ...:         gs.report(step=epoch, val_loss=val_loss)   # Optuna prunes from these
       ...:     return gs.unwrap(model).state_dict()
    In [2]: result = gs.sweep(train, {"lr": gs.loguniform(1e-4, 1e-1), "width": gs.choice([32, 64])},
       ...:                   trials=16, parallel=4, objective="val_loss", gpus=1)
    In [3]: result.best.params, result.best.value, result.best.result

    Each trial is a lease of its own (a gang when `gpus` > 1), asked for when one of the
    `parallel` slots is free and released the moment the trial ends; trials run at `priority`
    ("low" by default, so a sweep yields to interactive work: a preempted trial is queued again
    and continues from its last gs.save_checkpoint). `train` is a plain function (run with the
    distributed options given here: gpus, gpus_per_worker, timeout, ...) or a @gs.distributed
    one (run with its own). `sampler`: "tpe" | "random" | "grid" (or an Optuna sampler);
    `pruner`: "asha" | "median" | None (or an Optuna pruner). A trial that raises is recorded as
    failed; after `max_failed` failures the sweep stops (SweepFailed). `storage` (an Optuna
    storage or URL, e.g. "sqlite:///sweep.db") makes the sweep resumable: the same call continues
    the study named `study_name` (by default a name derived from the function, space and
    objective) and runs only the trials still missing. Ctrl-C stops every trial and releases
    every GPU. Bad arguments raise here, before anything is leased."""
    plan = validate_sweep(train, space, trials=trials, parallel=parallel, objective=objective, mode=mode,
                          sampler=sampler, pruner=pruner, max_failed=max_failed, priority=priority,
                          storage=storage, study_name=study_name, seed=seed,
                          distributed_options=distributed_options)
    study = _study(plan)
    board = make_board(objective=plan.objective, mode_min=plan.mode.value == "min", budget=plan.budget(),
                       world_size=plan.run_options.lease.workers)
    runner = SweepRunner(plan, study, board)
    error: BaseException | None = None
    try:
        runner.run()
    except BaseException as exc:
        error = exc
        raise
    finally:
        board.close(error)
    result = _result(plan, study, runner)
    if runner.fatal is not None:
        raise runner.fatal
    if runner.stop.reason is StopReason.FAILED:
        shown = "; ".join(f"trial {r.number}: {r.error}" for r in runner.failed[:3])
        raise SweepFailed(
            f"{len(runner.failed)} trials failed (max_failed={plan.max_failed}), so the sweep stopped after "
            f"{sum(1 for r in result.trials if r.state.counts)} of {plan.budget()} trials: {shown}. "
            "Fix the function (the error's .result keeps the trials so far) or raise max_failed.", result)
    return result


def _study(plan: SweepPlan):
    import optuna

    # Optuna logs a line per finished trial; the trials table says the same, once
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=plan.storage, sampler=plan.optuna_sampler(), pruner=plan.optuna_pruner(),
                               study_name=plan.study_name, direction=plan.mode.direction, load_if_exists=True)


def _result(plan: SweepPlan, study, runner: SweepRunner) -> SweepResult:
    from optuna.trial import TrialState as OptunaState

    best = None
    if any(t.state == OptunaState.COMPLETE for t in study.get_trials(deepcopy=False)):
        frozen = study.best_trial
        kept = runner.best_kept
        returned = kept[2] if kept is not None and kept[0] == frozen.number else None
        best = BestTrial(number=frozen.number, params=dict(frozen.params), value=frozen.value, result=returned)
    return SweepResult(best=best, trials=runner.records(), study=study, objective=plan.objective,
                       mode_min=plan.mode.value == "min")
