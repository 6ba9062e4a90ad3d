"""Which notebook cell is running now, as JupyterLab names it: Lab sends each cell's id in its
execute request's metadata (`cellId`), which the kernel keeps as the request's parent message.
None outside a kernel, or for a front end that sends no id."""
from __future__ import annotations

import sys


def asking_cell_id() -> str | None:
    ipython = sys.modules.get("IPython")  # never imports IPython: a plain script has no cell
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "get_parent"):
        return None
    parent = kernel.get_parent() or {}
    cell = (parent.get("metadata") or {}).get("cellId")
    return cell if isinstance(cell, str) else None
