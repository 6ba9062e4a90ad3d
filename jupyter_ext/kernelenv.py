"""Kernels started by the server find the cluster and know their user without any setup.

jupyter_server starts every kernel (from the kernels API or a session) through its kernel
manager's `start_kernel`, whose `env` keyword becomes the kernel's whole environment (jupyter_client
takes os.environ when none is given). Wrapping that one method of the server's own manager adds
gpusession's variables whatever kernel manager class the server is configured with; restarts
reuse the environment of the first start.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable

from jupyter_core.utils import ensure_async

# Never inherited by kernels: with it, user code could act as a broker admin.
SECRET_VARIABLES = ("GPUSESSION_ADMIN_TOKEN",)
# Behind a gateway a kernel reaches gpusession through it alone: no Ray variable is passed on.
RAY_VARIABLES = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
GATEWAY_ENV = "GPUSESSION_GATEWAY"  # gpusession.gateway.client's, without importing it here


def kernel_environment(base: dict, extra: dict) -> dict:
    dropped = SECRET_VARIABLES + (RAY_VARIABLES if extra.get(GATEWAY_ENV) else ())
    env = {k: v for k, v in base.items() if k not in dropped}
    env.update(extra)
    return env


def install(kernel_manager, make_env: Callable[[], Awaitable[dict]]) -> None:
    """Make `kernel_manager.start_kernel` put `await make_env()` into each new kernel's environment."""
    original = kernel_manager.start_kernel
    if getattr(original, "gpusession_env", False):
        return

    @functools.wraps(original)
    async def start_kernel(*args, **kwargs):
        base = kwargs.get("env") or os.environ
        kwargs["env"] = kernel_environment(base, await make_env())
        return await ensure_async(original(*args, **kwargs))

    start_kernel.gpusession_env = True
    kernel_manager.start_kernel = start_kernel
