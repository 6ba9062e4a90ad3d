"""Checkpoint commits as the caller keeps them: how the cell names the commit a run goes on
from ("the checkpoint after step 120")."""
from __future__ import annotations

from typing import Any


def last_step(history: list[dict]) -> Any:
    """The step of rank 0's last report, or None."""
    for report in reversed(history):
        step = report.get("step")
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            return step
    return None


def resume_point(info) -> str:
    """Where the next attempt starts, named by the step rank 0 reported last before that commit
    (not by the last step reported: steps after the commit are done again)."""
    if info._checkpoint_ref is None:
        return "the start (no checkpoint yet)"
    if info._checkpoint_step is None:
        return "the last checkpoint"
    return f"the checkpoint after step {info._checkpoint_step:g}"
