"""Inside a rank, Ray's API fails at once with an error that says what to use instead.

A rank is a plain process (as torchrun starts them), not a Ray worker. Without this guard, a
call such as `ray.get_runtime_context().get_node_id()` makes Ray connect on its own ("auto
init") from a process Ray does not know, which waited about 70 s per attempt ("Failed to get node
info: Deadline Exceeded") and then failed without saying why. Importing ray still works (a
library may import it for its types); connecting is what is refused: `ray.init`, and the
automatic connection of ray.get/put/remote/get_runtime_context, which goes through it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from ...errors import GPUSessionError

RAY_IN_RANK = (
    "Ray's API is not available inside a gpusession rank: a rank is a plain process (as torchrun "
    "starts them), not a Ray worker, so it cannot connect to the cluster. Use gs.context() for this "
    "rank's host, IP and Ray node id (.host, .address, .node_id) and its rank and devices; "
    "gs.report() for metrics; gs.save_checkpoint() for state; and pass what you got from Ray as an "
    "argument (the caller resolves an ObjectRef argument before the call)."
)


class RayInRank(GPUSessionError):
    """Ray's API was called inside a rank, which is not a Ray worker."""


def _refuse(*_args, **_kwargs):
    raise RayInRank(RAY_IN_RANK)


def _guard(module) -> None:
    module.init = _refuse


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `ray` as usual, and guards it as soon as it has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "ray":
            return None
        sys.meta_path.remove(self)  # find the real module with the other finders
        try:
            spec = importlib.util.find_spec("ray")
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _GuardingLoader(spec.loader)
        return spec


class _GuardingLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _guard(module)


def install() -> None:
    """Called in the rank before the user's code: a later `import ray` is guarded."""
    if "ray" in sys.modules:  # not the case in a rank (the zygote never imports it), but be sure
        _guard(sys.modules["ray"])
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
