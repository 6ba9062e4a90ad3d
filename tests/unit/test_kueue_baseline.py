"""The utilization replay's Kueue-like baseline (benchmarks/_kueue_baseline.py): gang admission in
order, and with priorities a normal burst evicts a whole low one, which is requeued for its work
left and pays its start again."""
from __future__ import annotations

import sys

from ..conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _kueue_baseline import replay_kueue  # noqa: E402
from _replay_world import DAY_S, Costs, User  # noqa: E402

COSTS = Costs(start_s=1.0, resize_s=1.0, baseline_start_s=1.0, source="test")


def day(burst_s: float = 600.0) -> list[User]:
    """Two 4-GPU users fill the 8 GPUs at once; a 1-GPU user asks 10 s later."""
    never = [DAY_S] * 200  # after its burst a user thinks past the day's end
    return [User("big-a", 4, 0.0, [0.0] + never, [burst_s] * 200),
            User("big-b", 4, 0.0, [0.0] + never, [burst_s] * 200),
            User("small", 1, 10.0, [0.0] + never, [burst_s] * 200)]


def test_without_preemption_the_small_burst_waits_for_a_whole_job_to_end():
    world = replay_kueue(day(), COSTS)
    small = world.users[2]
    assert world.stopped == 0 and small.waits == [600.0 + 1.0 - 10.0]


def test_with_priorities_the_small_burst_evicts_one_low_burst_that_runs_again_later():
    world = replay_kueue(day(), COSTS, preemption=True)
    small = world.users[2]
    assert world.stopped == 1 and small.waits == [0.0]
    evicted = next(u for u in world.users[:2] if len(u.waits) == 2)
    assert evicted.ran == 1  # asked once, ran to its end after the requeue
    # its GPU-seconds of work are all done in the end, though it held GPUs twice and paid 2 starts
    assert evicted.used_s == 4 * 600.0
