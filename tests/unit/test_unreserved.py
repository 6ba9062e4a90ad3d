"""A release waits until its GPUs show free in Ray: "free + held by other groups" must grow by
its own GPUs. That sum is read from two GCS tables one after the other; a group created between
the two reads (another thread's lease placed while this one releases) must not count twice."""
from __future__ import annotations

from gpusession.cluster.unreserved import consistent_unreserved, unreserved

OURS, THEIRS = "aaaa", "cccc"
NODE = "n1"


def totals(*groups: str) -> dict:
    return {NODE: {"GPU": 4.0, **{f"GPU_group_{g}": 2.0 for g in groups}, "CPU": 2.0}}


def free(gpus: float) -> dict:
    return {NODE: {"GPU": gpus}}


def scripted(*readings):
    """A reader that returns these readings in order (the last one for ever after)."""
    queue = list(readings)
    return lambda: queue.pop(0) if len(queue) > 1 else queue[0]


def test_a_group_placed_between_the_two_reads_would_count_twice_in_one_reading():
    # ours holds 2 GPUs; 2 are free; another thread's group takes those 2 between the reads:
    # the free GPUs were read before it reserved them, the totals after it was created
    torn = unreserved(totals(OURS, THEIRS), free(2.0), excluding_group=OURS)
    assert torn == {NODE: 4.0}  # 2 free + 2 held by theirs: but those are the same 2 GPUs
    # so a release taking this as "before" would wait for 4 + 2 = 6 of 4 GPUs: never (5 s timeout)


def test_the_consistent_reading_reads_again_when_the_groups_changed_around_the_free_gpus():
    read_totals = scripted(totals(OURS), totals(OURS, THEIRS), totals(OURS, THEIRS))
    read_free = scripted(free(2.0), free(0.0))
    assert consistent_unreserved(read_totals, read_free, excluding_group=OURS) == {NODE: 2.0}


def test_a_steady_view_is_read_once_and_our_own_group_is_left_out():
    read_totals = scripted(totals(OURS, THEIRS))
    read_free = scripted(free(0.0))
    assert consistent_unreserved(read_totals, read_free, excluding_group=OURS) == {NODE: 2.0}
    # after our removal: our 2 GPUs are back, so the sum grew by exactly ours
    assert consistent_unreserved(scripted(totals(THEIRS)), scripted(free(2.0)), excluding_group=OURS) == {NODE: 4.0}


def test_groups_that_keep_changing_end_the_reading_after_a_few_tries():
    changing = iter([totals(), totals(THEIRS), totals(), totals(THEIRS), totals(), totals(THEIRS), totals()])
    result = consistent_unreserved(lambda: next(changing), scripted(free(2.0)), excluding_group=OURS, tries=3)
    assert result == {NODE: 4.0}  # the last reading, taken as it is
