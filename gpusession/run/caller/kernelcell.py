"""Which notebook and cell a kernel runs now, as its Jupyter server and JupyterLab name them.

The notebook: jupyter_server gives each kernel of a session JPY_SESSION_NAME, the notebook's path
on disk; gpusession's server extension adds its root directory (NOTEBOOK_ROOT_ENV), so a lease
names the notebook as the server's contents API does ("work/train.ipynb"). The cell: JupyterLab
sends each cell's id in its execute request's metadata (`cellId`), which the kernel keeps as the
request's parent message. None outside a kernel, or for a front end that sends neither.
Whether a background run asks: its thread marks its own copy of the caller's context.
"""
from __future__ import annotations

import contextvars
import os
import sys

NOTEBOOK_ROOT_ENV = "GPUSESSION_NOTEBOOK_ROOT"
_IN_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("gpusession_in_background", default=False)


def notebook_path(session_name: str | None, root: str | None) -> str | None:
    """PURE: the notebook's path relative to the server's root, when it lies inside it."""
    if not session_name:
        return None
    top = (root or "").rstrip("/")
    if top and session_name.startswith(top + "/"):
        return session_name[len(top) + 1:]
    return session_name


def asking_notebook() -> str | None:
    return notebook_path(os.environ.get("JPY_SESSION_NAME"), os.environ.get(NOTEBOOK_ROOT_ENV))


def asking_cell_id() -> str | None:
    ipython = sys.modules.get("IPython")  # never imports IPython: a plain script has no cell
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "get_parent"):
        return None
    parent = kernel.get_parent() or {}
    cell = (parent.get("metadata") or {}).get("cellId")
    return cell if isinstance(cell, str) else None


def mark_background() -> None:
    """Called first in a background run's thread, whose context is a copy: the caller stays unmarked."""
    _IN_BACKGROUND.set(True)


def asking_in_background() -> bool:
    return _IN_BACKGROUND.get()
