"""gpusession: lease GPUs from a Ray cluster only while notebook code runs.

    import gpusession as gs

    @gs.distributed(gpus=2)
    def train(lr):
        ctx = gs.context()
        ...
"""
__version__ = "0.1.0"

import copyreg as _copyreg
import importlib as _importlib
import logging as _logging
import sys as _sys
import warnings as _warnings
import types as _types

# Ray notes at import that ipywidgets is missing (for its own progress widgets); in a notebook
# that lands in the user's first cell. gpusession draws its own display.
_logging.getLogger("ray.widgets.util").setLevel(_logging.WARNING)
# Likewise Ray imports tqdm.auto, which warns in a kernel without ipywidgets ("IProgress not
# found"): a red box in a newcomer's first cell about a progress bar gpusession never draws.
_warnings.filterwarnings("ignore", message="IProgress not found", module=r"tqdm\.auto")

# Public names resolve on first use (PEP 562), so `import gpusession` -- and the `gpusession` CLI --
# import neither Ray nor torch until something needs them (`gpusession status` answers in well
# under a second). Three public functions share their name with the module that defines them
# (context, lease, status): the package keeps the function, never the submodule, under that name.
_EXPORTS = {
    "context": "context", "load_checkpoint": "context", "prepare_loader": "context", "prepare_model": "context",
    "report": "context", "save_checkpoint": "context", "unwrap": "context",
    "DistributedFunction": "distributed", "distributed": "distributed",
    "GPUSessionError": "errors", "Infeasible": "errors", "LeaseRevoked": "errors", "Preempted": "errors",
    "QueueTimeout": "errors", "QuotaExceeded": "errors", "RunTimeout": "errors", "WorkerFailed": "errors",
    "RunInfo": "events", "Lease": "lease", "lease": "lease", "Status": "status", "status": "status",
    "should_checkpoint": "context",
    "sweep": "sweeps", "SweepFailed": "sweeps", "SweepResult": "sweeps", "choice": "sweeps",
    "loguniform": "sweeps", "randint": "sweeps", "uniform": "sweeps",
}
_SHADOWED = frozenset(name for name, module in _EXPORTS.items() if name == module)


class _Package(_types.ModuleType):
    def __setattr__(self, name, value):
        if name in _SHADOWED and isinstance(value, _types.ModuleType):
            return  # the import system binding the submodule: keep resolving the function
        super().__setattr__(name, value)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpusession' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


_sys.modules[__name__].__class__ = _Package
# pickle (and cloudpickle, which ships user functions that read `gs.`) knows plain modules by
# their name; the subclass needs saying so, or a function using `gs` could not be sent to workers.
_copyreg.pickle(_Package, lambda module: (_importlib.import_module, (module.__name__,)))

__all__ = [
    "distributed", "DistributedFunction", "lease", "Lease", "status", "Status", "RunInfo",
    "context", "report", "save_checkpoint", "load_checkpoint", "prepare_model", "prepare_loader",
    "unwrap", "GPUSessionError", "QuotaExceeded", "Infeasible", "QueueTimeout", "LeaseRevoked",
    "Preempted", "WorkerFailed", "RunTimeout", "should_checkpoint",
    "sweep", "uniform", "loguniform", "choice", "randint", "SweepResult", "SweepFailed",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext gpusession`: the %%gpu and %gpu magics."""
    from .magics import load_ipython_extension as load

    load(ipython)


def _jupyter_server_extension_points():
    """The Jupyter server extension lives in jupyter_ext; imported only when the server loads it."""
    return [{"module": "jupyter_ext.app", "app": _server_app()}]


def _server_app():
    from jupyter_ext.app import GPUSessionApp

    return GPUSessionApp
