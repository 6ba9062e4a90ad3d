"""The search space in plain values: `gs.uniform`, `gs.loguniform`, `gs.choice`, `gs.randint`.

A space is a dict of argument name -> distribution or constant (constants are passed to every
trial as they are), or, for experts, an Optuna define-by-run function `space(trial) -> dict`.
Each distribution maps onto Optuna's own, so every Optuna sampler can search it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

if TYPE_CHECKING:  # optuna is imported when a sweep starts, not with gpusession
    import optuna
    from optuna.distributions import BaseDistribution


def _number(value: Any, *, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise TypeError(f"{where}: {name} must be a finite number; got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float

    def optuna(self) -> "BaseDistribution":
        from optuna.distributions import FloatDistribution

        return FloatDistribution(self.low, self.high)

    def grid(self) -> list:
        raise ValueError(
            f"sampler='grid' needs finite choices, but uniform({self.low:g}, {self.high:g}) is continuous. "
            "Use gs.choice([...]) or gs.randint(...) for that argument, or sampler='tpe'."
        )


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float

    def optuna(self) -> "BaseDistribution":
        from optuna.distributions import FloatDistribution

        return FloatDistribution(self.low, self.high, log=True)

    def grid(self) -> list:
        raise ValueError(
            f"sampler='grid' needs finite choices, but loguniform({self.low:g}, {self.high:g}) is continuous. "
            "Use gs.choice([...]) for that argument, or sampler='tpe'."
        )


@dataclass(frozen=True)
class Choice:
    options: tuple

    def optuna(self) -> "BaseDistribution":
        from optuna.distributions import CategoricalDistribution

        return CategoricalDistribution(self.options)

    def grid(self) -> list:
        return list(self.options)


@dataclass(frozen=True)
class RandInt:
    low: int
    high: int  # inclusive, like random.randint and Optuna's suggest_int

    def optuna(self) -> "BaseDistribution":
        from optuna.distributions import IntDistribution

        return IntDistribution(self.low, self.high)

    def grid(self) -> list:
        return list(range(self.low, self.high + 1))


Distribution = Union[Uniform, LogUniform, Choice, RandInt]
DISTRIBUTIONS = (Uniform, LogUniform, Choice, RandInt)
SpaceFunction = Callable[["optuna.Trial"], Mapping[str, Any]]


def uniform(low: float, high: float) -> Uniform:
    """A float drawn evenly between low and high: `gs.uniform(0.0, 0.5)`."""
    lo, hi = _number(low, name="low", where="gs.uniform"), _number(high, name="high", where="gs.uniform")
    if lo >= hi:
        raise ValueError(f"gs.uniform needs low < high; got low={low!r}, high={high!r}.")
    return Uniform(lo, hi)


def loguniform(low: float, high: float) -> LogUniform:
    """A float drawn evenly on a log scale, for learning rates: `gs.loguniform(1e-5, 1e-1)`."""
    lo, hi = _number(low, name="low", where="gs.loguniform"), _number(high, name="high", where="gs.loguniform")
    if lo <= 0 or lo >= hi:
        raise ValueError(f"gs.loguniform needs 0 < low < high; got low={low!r}, high={high!r}.")
    return LogUniform(lo, hi)


def choice(options) -> Choice:
    """One of a list of values (numbers, strings, booleans, None): `gs.choice([32, 64, 128])`."""
    if isinstance(options, (str, bytes)) or not hasattr(options, "__iter__"):
        raise TypeError(f"gs.choice takes a list of values, e.g. gs.choice([32, 64]); got {options!r}.")
    values = tuple(options)
    if not values:
        raise ValueError("gs.choice needs at least one value, e.g. gs.choice([32, 64]).")
    for value in values:  # what Optuna can store (and a SQLite storage can reload)
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"gs.choice values must be numbers, strings, booleans or None; got {value!r}. "
                "Choose a name and look the object up inside the function."
            )
    return Choice(values)


def randint(low: int, high: int) -> RandInt:
    """A whole number from low to high, both included: `gs.randint(1, 4)`."""
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"gs.randint: {name} must be a whole number; got {value!r}.")
    if low > high:
        raise ValueError(f"gs.randint needs low <= high; got low={low!r}, high={high!r}.")
    return RandInt(low, high)


@dataclass(frozen=True)
class Space:
    """A validated space: what is searched, what is fixed, or a define-by-run function."""

    searched: dict[str, Distribution]
    fixed: dict[str, Any]
    function: SpaceFunction | None = None

    def distributions(self) -> "dict[str, BaseDistribution]":
        return {name: dist.optuna() for name, dist in self.searched.items()}

    def grid(self) -> dict[str, list]:
        if self.function is not None:
            raise ValueError("sampler='grid' needs a dict space (gs.choice / gs.randint values), not a function.")
        if not self.searched:
            raise ValueError("sampler='grid' needs at least one gs.choice or gs.randint in the space.")
        return {name: dist.grid() for name, dist in self.searched.items()}

    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.grid().values())

    def params_of(self, trial: "optuna.Trial") -> dict[str, Any]:
        """The trial's arguments: searched values (as Optuna sampled them) plus the constants."""
        if self.function is not None:
            params = self.function(trial)
            if not isinstance(params, Mapping):
                raise TypeError(
                    f"The space function must return a dict of the trial's arguments; got {type(params).__name__}."
                )
            return dict(params)
        return {**self.fixed, **{name: trial.params[name] for name in self.searched}}

    def describe(self) -> str:
        """A stable text of the space, for naming a study after the call."""
        if self.function is not None:
            return f"function:{getattr(self.function, '__qualname__', repr(self.function))}"
        parts = [f"{name}={dist!r}" for name, dist in sorted(self.searched.items())]
        # a constant's repr may hold a memory address (a dataset object): only plain values are
        # spelled out, so the name survives a kernel restart
        parts += [f"{name}:{value!r}" if value is None or isinstance(value, (bool, int, float, str))
                  else f"{name}:{type(value).__qualname__}" for name, value in sorted(self.fixed.items())]
        return ",".join(parts)


def parse_space(space: Any) -> Space:
    if callable(space) and not isinstance(space, Mapping):
        return Space({}, {}, function=space)
    if not isinstance(space, Mapping):
        raise TypeError(
            "space must be a dict like {'lr': gs.loguniform(1e-4, 1e-1), 'layers': gs.randint(1, 4)} "
            f"or an Optuna function space(trial) -> dict; got {type(space).__name__}."
        )
    searched, fixed = {}, {}
    for name, value in space.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"space keys must be the function's argument names; got {name!r}.")
        if isinstance(value, DISTRIBUTIONS):
            searched[name] = value
        else:
            fixed[name] = value
    if not searched:
        raise ValueError(
            "space has nothing to search: give at least one argument a gs.uniform, gs.loguniform, "
            "gs.choice or gs.randint value."
        )
    return Space(searched, fixed)
