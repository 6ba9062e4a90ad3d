"""`%%gpu N --bg [-o NAME] [--detach]`: the cell returns at once; its run's handle can `pull()` its names.

A background cell's names are never written into the notebook behind the user's back (a value
changing under a cell that reads it is a bug nobody can find): the run keeps them, its receipt
says which, and `NAME.pull()` assigns them (and returns the last expression's value).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from ..observe.events import Observer, RunInfo
from ..api.background import Run
from ..api.detached import DetachedRun


def pull_note(name: str, wanted: tuple[str, ...]) -> str:
    """PURE: the line under a finished background cell's receipt."""
    if not wanted:
        return f"gpusession: run {name!r} finished; {name}.pull() returns its last expression's value."
    names = ", ".join(wanted)
    return (f"gpusession: run {name!r} finished; its names ({names}) are not in the notebook yet: "
            f"{name}.pull() assigns them.")


class CellRun(Run):
    """The handle of a %%gpu --bg cell: a Run whose `pull()` brings the cell's names back."""

    def __init__(self, name: str, start: Callable[[Observer, RunInfo], Any], observer: Observer, *,
                 shell, handle_name: str, wanted: tuple[str, ...], bring_back: Callable[[dict, Any], Any],
                 **rest: Any) -> None:
        def start_then_say(run_observer: Observer, info: RunInfo) -> Any:
            result = start(run_observer, info)
            print(pull_note(handle_name, wanted), file=sys.stdout, flush=True)  # in the starting cell
            return result

        super().__init__(name, start_then_say, observer, **rest)
        self.handle_name = handle_name
        self.wanted = wanted
        self._shell = shell
        self._bring_back = bring_back
        self.pulled = False

    def pull(self, timeout: float | None = None) -> Any:
        """Wait for the run (up to `timeout` s), assign the cell's names in the notebook, and return
        its last expression's value. Raises the run's error as the blocking cell would."""
        result = self.result(timeout)
        self._shell.user_ns["_gpu"] = self.info
        self.pulled = True
        return self._bring_back(self._shell.user_ns, result)


class DetachedCellRun(CellRun, DetachedRun):
    """The handle of a %%gpu --bg --detach cell (and of `%gpu attach ID -o NAME` in any kernel
    of the same account): `pull()` as any background cell, `run_id` for gs.attach."""
