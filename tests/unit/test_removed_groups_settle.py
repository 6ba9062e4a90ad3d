"""A group a caller removed counts as the broker's own while its lease is open: the caller tells
the broker only once Ray's view shows the GPUs free, so a reading in between must not count
them as used outside gpusession (which showed a user fewer GPUs free right after a run)."""
from __future__ import annotations

from gpusession.broker.service.rayview import SETTLE_S, GroupState, Settling, Snapshot, settling_groups
from gpusession.cluster.placement import PlacementState


def group(pg_id: str, state: PlacementState, **gpus_by_node: float) -> GroupState:
    return GroupState(pg_id, state, {node: int(gpus) for node, gpus in gpus_by_node.items()}, gpus_by_node)


def reading(groups: dict[int, GroupState], settling: dict[str, Settling] | None = None) -> Snapshot:
    return Snapshot([], True, groups=groups, settling=settling or {})


def test_a_group_removed_under_an_open_lease_settles_with_its_gpus_per_node():
    before = reading({7: group("pg7", PlacementState.CREATED, head=1.0, host1=1.0)})
    now = {7: group("pg7", PlacementState.REMOVED)}  # Ray's table no longer says where it was
    settled = Settling(7, {"head": 1.0, "host1": 1.0}, 100.0)
    assert settling_groups(before, now, frozenset({7}), 100.0) == {"pg7": settled}


def test_a_settling_group_ends_with_the_first_reading_after_its_lease_closed():
    earlier = reading({}, {"pg7": Settling(7, {"head": 2.0}, 100.0)})
    assert settling_groups(earlier, {}, frozenset({7}), 101.0) == {"pg7": Settling(7, {"head": 2.0}, 100.0)}
    assert settling_groups(earlier, {}, frozenset(), 101.0) == {}


def test_a_lease_that_holds_a_new_group_lets_its_old_one_go_after_the_bound():
    earlier = reading({7: group("pg7b", PlacementState.CREATED, head=2.0)}, {"pg7": Settling(7, {"head": 2.0}, 100.0)})
    groups = {7: group("pg7b", PlacementState.CREATED, head=2.0)}
    assert "pg7" in settling_groups(earlier, groups, frozenset({7}), 100.0 + SETTLE_S - 0.1)
    assert settling_groups(earlier, groups, frozenset({7}), 100.0 + SETTLE_S) == {}


def test_no_reading_before_means_nothing_settles_and_a_created_group_never_does():
    assert settling_groups(None, {}, frozenset({7}), 100.0) == {}
    before = reading({7: group("pg7", PlacementState.CREATED, head=1.0)})
    assert settling_groups(before, {7: group("pg7", PlacementState.CREATED, head=1.0)}, frozenset({7}), 101.0) == {}
