"""gpusession: lease GPUs from a Ray cluster only while notebook code runs.

    import gpusession as gs

    @gs.distributed(gpus=2)
    def train(lr):
        ctx = gs.context()
        ...
"""
__version__ = "0.1.0"

import logging as _logging

# Ray notes at import that ipywidgets is missing (for its own progress widgets); in a notebook
# that lands in the user's first cell. gpusession draws its own display.
_logging.getLogger("ray.widgets.util").setLevel(_logging.WARNING)

from .context import (  # noqa: E402
    context,
    load_checkpoint,
    prepare_loader,
    prepare_model,
    report,
    save_checkpoint,
    unwrap,
)
from .distributed import DistributedFunction, distributed  # noqa: E402
from .errors import (  # noqa: E402
    GPUSessionError,
    Infeasible,
    LeaseRevoked,
    Preempted,
    QueueTimeout,
    QuotaExceeded,
    RunTimeout,
    WorkerFailed,
)
from .events import RunInfo  # noqa: E402
from .lease import Lease, lease  # noqa: E402
from .status import Status, status  # noqa: E402
from .sweeps import SweepFailed, SweepResult, choice, loguniform, randint, sweep, uniform  # noqa: E402

__all__ = [
    "distributed", "DistributedFunction", "lease", "Lease", "status", "Status", "RunInfo",
    "context", "report", "save_checkpoint", "load_checkpoint", "prepare_model", "prepare_loader",
    "unwrap", "GPUSessionError", "QuotaExceeded", "Infeasible", "QueueTimeout", "LeaseRevoked",
    "Preempted", "WorkerFailed", "RunTimeout",
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
