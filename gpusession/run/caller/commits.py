"""Checkpoint commits as the caller keeps them: its own copy of rank 0's object, and how the
cell names the commit a run goes on from ("the checkpoint after step 120")."""
from __future__ import annotations

from typing import Any

import ray


def hold(ref) -> Any:
    """The caller's own copy of a checkpoint rank 0 committed (an ObjectRef). Ray keeps an object
    a worker yields in the object store of the worker's node (unless small enough to inline):
    lost with that node, while the copy fetched to the caller's node is evictable. ray.put of the
    fetched value makes an object the caller owns, pinned on its node (spilled, never evicted).
    Its bytes are a numpy array (worker._out_of_band): one memcpy, no unpickling."""
    return ray.put(ray.get(ref))


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
    if info.checkpoint_ref is None:
        return "the start (no checkpoint yet)"
    if info.checkpoint_step is None:
        return "the last checkpoint"
    return f"the checkpoint after step {info.checkpoint_step:g}"
