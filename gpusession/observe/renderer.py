"""Which renderer draws a call: the one a test or tool set (events.set_observer_factory), the
notebook's live cell view inside an IPython kernel, else console lines. Apart from events.py so
that events (the Observer and RunInfo every renderer imports) imports no renderer."""
from __future__ import annotations

from . import events
from .console import ConsoleObserver
from .events import Observer


def default_observer(world_size: int, *, background: bool = False) -> Observer:
    """background: for a run that outlives the cell that started it (its view keeps updating)."""
    if events._factory is not None:
        return events._factory(world_size)
    if events._in_notebook_kernel():
        from .display import NotebookObserver  # IPython only where a kernel runs

        return NotebookObserver(world_size, background=background)
    return ConsoleObserver(world_size)
