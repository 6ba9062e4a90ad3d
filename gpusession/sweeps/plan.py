"""What a `gs.sweep` call asks for, validated before anything is leased, and the Optuna parts it
maps onto (sampler, pruner, study name). The search and the pruning are Optuna's own."""
from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Callable

from ..api.distributed import DistributedFunction, parse_options
from ..run.caller.options import RunOptions
from .space import Space, parse_space


class Mode(str, enum.Enum):
    MIN = "min"
    MAX = "max"

    @property
    def direction(self) -> str:
        return "minimize" if self is Mode.MIN else "maximize"

    def better(self, a: float, b: float) -> bool:
        return a < b if self is Mode.MIN else a > b


SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "median", None)
# ASHA as Ray Tune's ASHAScheduler defaults it (grace period 1, reduction factor 4), so the
# benchmark compares the same search.
ASHA_MIN_RESOURCE = 1
ASHA_REDUCTION_FACTOR = 4
MEDIAN_STARTUP_TRIALS = 4  # the median of fewer finished curves prunes good trials by chance


@dataclass(frozen=True)
class SweepPlan:
    fn: Callable
    run_options: RunOptions  # each trial's options (priority and sweep id set by the sweep)
    space: Space
    trials: int
    parallel: int
    objective: str
    mode: Mode
    sampler: Any  # "tpe" | "random" | "grid" | an optuna sampler
    pruner: Any  # "asha" | "median" | None | an optuna pruner
    max_failed: int
    storage: Any
    study_name: str
    seed: int | None

    def optuna_sampler(self):
        import optuna

        if not isinstance(self.sampler, str):
            return self.sampler
        if self.sampler == "grid":
            return optuna.samplers.GridSampler(self.space.grid(), seed=self.seed)
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        # constant_liar: trials running in parallel count as "bad so far", so parallel asks
        # do not all land on the same point
        return optuna.samplers.TPESampler(seed=self.seed, constant_liar=True)

    def optuna_pruner(self):
        import optuna

        if self.pruner is None:
            return optuna.pruners.NopPruner()
        if not isinstance(self.pruner, str):
            return self.pruner
        if self.pruner == "asha":
            return optuna.pruners.SuccessiveHalvingPruner(
                min_resource=ASHA_MIN_RESOURCE, reduction_factor=ASHA_REDUCTION_FACTOR)
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS)

    def budget(self) -> int:
        """How many trials the study should hold in the end (a grid has no more points than this)."""
        if self.sampler == "grid":
            return min(self.trials, self.space.grid_size())
        return self.trials


def _positive_int(value: Any, *, name: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, e.g. {example}; got {value!r}.")
    return value


def _is_optuna_sampler(value: Any) -> bool:
    import optuna

    return isinstance(value, optuna.samplers.BaseSampler)


def _is_optuna_pruner(value: Any) -> bool:
    import optuna

    return isinstance(value, optuna.pruners.BasePruner)


def validate_sweep(fn: Any, space: Any, *, trials: Any, parallel: Any, objective: Any, mode: Any,
                   sampler: Any, pruner: Any, max_failed: Any, priority: Any, storage: Any,
                   study_name: Any, seed: Any, distributed_options: dict) -> SweepPlan:
    if not callable(fn):
        raise TypeError(f"gs.sweep needs a training function first; got {type(fn).__name__}.")
    parsed_space = parse_space(space)
    trials = _positive_int(trials, name="trials", example="trials=16")
    parallel = _positive_int(parallel, name="parallel", example="parallel=4")
    if not isinstance(objective, str) or not objective:
        raise TypeError(
            f"objective must be the name of a gs.report value, e.g. objective='val_loss'; got {objective!r}.")
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max'; got {mode!r}.")
    if not (sampler in SAMPLERS or _is_optuna_sampler(sampler)):
        raise ValueError(f"sampler must be 'tpe', 'random', 'grid' or an optuna sampler; got {sampler!r}.")
    if not (pruner in PRUNERS or _is_optuna_pruner(pruner)):
        raise ValueError(f"pruner must be 'asha', 'median', None or an optuna pruner; got {pruner!r}.")
    if sampler == "grid":
        parsed_space.grid()  # raises when a searched argument is continuous
    if isinstance(max_failed, bool) or not isinstance(max_failed, int) or max_failed < 1:
        raise ValueError(
            f"max_failed must be a whole number >= 1 (stop after that many failed trials); got {max_failed!r}.")
    if study_name is not None and (not isinstance(study_name, str) or not study_name.strip()):
        raise TypeError(f"study_name must be a non-empty string or None; got {study_name!r}.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be a whole number or None; got {seed!r}.")
    if storage is not None and not isinstance(storage, str) and not _is_storage(storage):
        raise TypeError(f"storage must be an Optuna storage or its URL, e.g. 'sqlite:///sweep.db'; got {storage!r}.")
    function, run_options = _trial_function(fn, priority, distributed_options)
    plan = SweepPlan(
        fn=function, run_options=run_options, space=parsed_space, trials=trials, parallel=parallel,
        objective=objective, mode=Mode(mode), sampler=sampler, pruner=pruner, max_failed=max_failed,
        storage=storage, study_name="", seed=seed,
    )
    name = study_name.strip() if study_name else default_study_name(plan)
    lease = dataclasses.replace(plan.run_options.lease, sweep_id=name[:64])
    return dataclasses.replace(plan, study_name=name,
                               run_options=dataclasses.replace(plan.run_options, lease=lease))


def _is_storage(value: Any) -> bool:
    import optuna

    return isinstance(value, optuna.storages.BaseStorage)


def _trial_function(fn: Any, priority: Any, distributed_options: dict) -> tuple[Callable, RunOptions]:
    """A plain function runs with the sweep's distributed options; a @gs.distributed one with
    its own. Either way the trials run at the sweep's priority (low by default: a sweep yields
    its GPUs to interactive work)."""
    if isinstance(fn, DistributedFunction):
        if distributed_options:
            raise TypeError(
                f"{fn.__name__} is already @gs.distributed, so its options come from the decorator; "
                f"move {', '.join(sorted(distributed_options))} into @gs.distributed(...) or pass the plain function."
            )
        options = fn.options
        base = fn.fn
    else:
        options = parse_options(distributed_options, where="gs.sweep()")
        base = fn
    from ..broker.policy.model import Priority

    lease = dataclasses.replace(options.lease, priority=Priority.parse(priority))
    return base, dataclasses.replace(options, lease=lease)


def default_study_name(plan: SweepPlan) -> str:
    """The same call names the same study, so `storage=` continues it after a kernel restart;
    a changed space, objective or function name starts a new one."""
    fn_name = getattr(plan.fn, "__qualname__", getattr(plan.fn, "__name__", "train"))
    module = getattr(plan.fn, "__module__", "") or ""
    sampler = plan.sampler if isinstance(plan.sampler, str) else type(plan.sampler).__name__
    pruner = plan.pruner if isinstance(plan.pruner, str) or plan.pruner is None else type(plan.pruner).__name__
    key = "|".join([module, fn_name, plan.space.describe(), plan.objective, plan.mode.value, str(sampler),
                    str(pruner)])
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    short = "".join(c if c.isalnum() or c in "_-" else "-" for c in fn_name)[:40]
    return f"sweep-{short}-{digest}"
