"""GPUs per node that no other placement group holds, from two of Ray's tables read one after
the other: each node's free resources, and its totals (where each group's GPUs show as a key).

The two tables are read by two calls to the GCS. A group created between them (another lease
of this kernel placed while a release waits: two background runs, one ending as a queued one
starts) is in one reading and not the other. Read as "free before it was reserved" plus "held
by it", its GPUs count twice, and a release that took such a reading as its "before" waited
for GPUs that could never come back: the full FREE_TIMEOUT_S (5 s) per release. So the totals
are read on both sides of the free resources, and a reading counts only when the groups did
not change in between. The logic takes the readers as arguments: tests/unit/test_unreserved.py
plays the torn reading deterministically.
"""
from __future__ import annotations

from typing import Callable

Table = dict[str, dict[str, float]]  # node id -> resource name -> amount
READ_TRIES = 5


def is_group_total(key: str) -> bool:
    # "GPU_group_<pg>" is a group's total on a node; "GPU_group_<i>_<pg>" is one bundle of it
    return key.startswith("GPU_group_") and key.count("_") == 2


def group_totals(totals: Table) -> dict[str, dict[str, float]]:
    """Per node, the GPUs of each placement group there (the groups Ray knows at that reading)."""
    return {node: {k: v for k, v in resources.items() if is_group_total(k)} for node, resources in totals.items()}


def unreserved(totals: Table, available: Table, *, excluding_group: str) -> dict[str, float]:
    """Per node: free GPUs plus GPUs held by placement groups other than `excluding_group`."""
    result = {}
    for node_id, resources in totals.items():
        held_by_others = sum(v for k, v in resources.items() if is_group_total(k) and excluding_group not in k)
        result[node_id] = available.get(node_id, {}).get("GPU", 0.0) + held_by_others
    return result


def consistent_unreserved(read_totals: Callable[[], Table], read_available: Callable[[], Table], *,
                          excluding_group: str, tries: int = READ_TRIES) -> dict[str, float]:
    """`unreserved` from a reading of the free resources with the same groups in the totals
    before and after it (up to `tries` readings; then the last one, groups still changing)."""
    before = read_totals()
    for _ in range(tries):
        available = read_available()
        after = read_totals()
        if group_totals(after) == group_totals(before):
            break
        before = after
    return unreserved(after, available, excluding_group=excluding_group)
