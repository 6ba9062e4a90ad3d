"""Hyperparameter sweeps on leased GPUs (SPEC section 7): `gs.sweep` and its search space."""
from .api import sweep
from .records import TrialRecord, TrialState
from .result import BestTrial, SweepFailed, SweepResult
from .space import choice, loguniform, randint, uniform

__all__ = ["sweep", "uniform", "loguniform", "choice", "randint", "SweepResult", "BestTrial", "SweepFailed",
           "TrialRecord", "TrialState"]
