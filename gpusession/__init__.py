"""gpusession: lease GPUs from a Ray cluster only while notebook code runs.

    import gpusession as gs

    @gs.distributed(gpus=2)
    def train(lr):
        ctx = gs.context()
        ...
"""
from ._version import __version__

import importlib as _importlib
import logging as _logging
import warnings as _warnings

# Ray notes at import that ipywidgets is missing (for its own progress widgets); in a notebook
# that lands in the user's first cell. gpusession draws its own display.
_logging.getLogger("ray.widgets.util").setLevel(_logging.WARNING)
# Likewise Ray imports tqdm.auto, which warns in a kernel without ipywidgets ("IProgress not
# found"): a red box in a newcomer's first cell about a progress bar gpusession never draws.
_warnings.filterwarnings("ignore", message="IProgress not found", module=r"tqdm\.auto")

# Public names resolve on first use (PEP 562), so `import gpusession` -- and the `gpusession` CLI --
# import neither Ray nor torch until something needs them (`gpusession status` answers in well
# under a second). No public function shares its name with a submodule: the rank-side API lives in
# run/rank/context.py, the caller's in api/ (distributed.py, lease_api.py, status.py), the Lease in
# run/caller/ (tests/unit/test_package.py keeps it so).
_EXPORTS = {
    "context": "run.rank.context", "load_checkpoint": "run.rank.context", "prepare_loader": "run.rank.context",
    "prepare_model": "run.rank.context", "report": "run.rank.context", "save_checkpoint": "run.rank.context",
    "unwrap": "run.rank.context", "should_checkpoint": "run.rank.context", "step": "run.rank.context",
    "DistributedFunction": "api.distributed", "distributed": "api.distributed",
    "Run": "api.background", "RunStatus": "api.background", "runs": "api.background",
    "attach": "api.detached", "RunCancelled": "errors",
    "GPUSessionError": "errors", "Infeasible": "errors", "LeaseRevoked": "errors", "Preempted": "errors",
    "QueueTimeout": "errors", "QuotaExceeded": "errors", "RunTimeout": "errors", "WorkerFailed": "errors",
    "ResultTooLarge": "errors",
    "RunInfo": "observe.events", "PowerSGD": "run.comm_options", "Lease": "run.caller.lease", "lease": "api.lease_api", "Status": "api.status",
    "status": "api.status",
    "sweep": "sweeps", "SweepFailed": "sweeps", "SweepResult": "sweeps", "choice": "sweeps",
    "loguniform": "sweeps", "randint": "sweeps", "uniform": "sweeps",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpusession' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "distributed", "DistributedFunction", "Run", "RunStatus", "runs", "attach", "RunCancelled", "lease", "Lease", "status", "Status", "RunInfo",
    "context", "report", "save_checkpoint", "load_checkpoint", "prepare_model", "prepare_loader",
    "unwrap", "GPUSessionError", "QuotaExceeded", "Infeasible", "QueueTimeout", "LeaseRevoked",
    "Preempted", "WorkerFailed", "ResultTooLarge", "RunTimeout", "should_checkpoint", "step",
    "sweep", "uniform", "loguniform", "choice", "randint", "SweepResult", "SweepFailed", "PowerSGD",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext gpusession`: the %%gpu and %gpu magics."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def _jupyter_server_extension_points():
    """The Jupyter server extension lives in jupyter_ext; imported only when the server loads it."""
    return [{"module": "jupyter_ext.app", "app": _server_app()}]


def _server_app():
    from jupyter_ext.app import GPUSessionApp

    return GPUSessionApp
