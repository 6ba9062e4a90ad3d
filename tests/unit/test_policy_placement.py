"""The fit function: where a gang's workers go, per placement, or None when it cannot fit now."""
import pytest

from gpusession.broker.policy.model import NodeCapacity, Placement
from gpusession.broker.policy.placement import cluster_limit, drain, plan, slots

PACK, SPREAD = Placement.PACK, Placement.SPREAD
STRICT_PACK, STRICT_SPREAD = Placement.STRICT_PACK, Placement.STRICT_SPREAD


@pytest.mark.parametrize(
    "free, workers, gpw, placement, expected",
    [
        # pack: best fit (the fullest node that still takes the whole gang)
        ({"a": 4, "b": 2, "c": 3}, 2, 1.0, PACK, {"b": 2}),
        # pack: no single node fits, so span nodes, emptiest first
        ({"a": 2, "b": 3, "c": 1}, 5, 1.0, PACK, {"b": 3, "a": 2}),
        ({"a": 2, "b": 3}, 6, 1.0, PACK, None),
        # strict_pack: one node or nothing, best fit
        ({"a": 4, "b": 3}, 3, 1.0, STRICT_PACK, {"b": 3}),
        ({"a": 2, "b": 2}, 4, 1.0, STRICT_PACK, None),
        # spread: round robin over nodes with room, emptiest first
        ({"a": 1, "b": 3, "c": 2}, 4, 1.0, SPREAD, {"b": 2, "c": 1, "a": 1}),
        ({"a": 4, "b": 0}, 3, 1.0, SPREAD, {"a": 3}),
        ({"a": 1, "b": 1}, 3, 1.0, SPREAD, None),
        # strict_spread: one worker per distinct node
        ({"a": 1, "b": 3, "c": 2}, 2, 1.0, STRICT_SPREAD, {"b": 1, "c": 1}),
        ({"a": 8, "b": 0}, 2, 1.0, STRICT_SPREAD, None),
        # whole multi-GPU workers never straddle nodes
        ({"a": 3, "b": 3}, 2, 2.0, PACK, {"a": 1, "b": 1}),
        ({"a": 3, "b": 3}, 3, 2.0, PACK, None),
        # fractional workers share a GPU
        ({"a": 1.0}, 4, 0.25, STRICT_PACK, {"a": 4}),
        ({"a": 1.0}, 5, 0.25, PACK, None),
        ({"a": 0.3, "b": 0.6}, 3, 0.3, PACK, {"b": 2, "a": 1}),
        # ties go to the node listed first
        ({"a": 2, "b": 2}, 1, 1.0, PACK, {"a": 1}),
        ({"a": 2, "b": 2}, 1, 1.0, SPREAD, {"a": 1}),
    ],
)
def test_plan_places_a_gang_whole_or_not_at_all(free, workers, gpw, placement, expected):
    assert plan(free, workers, gpw, placement) == expected


def test_float_gpu_counts_compare_with_epsilon():
    assert slots(0.1 + 0.2, 0.3) == 1  # 0.30000000000000004 is one 0.3 GPU worker
    assert slots(0.3 - 1e-12, 0.1) == 3
    assert slots(-1.0, 1.0) == 0


def test_a_node_with_negative_free_gpus_takes_nothing():
    assert plan({"a": -2.0, "b": 1.0}, 1, 1.0, PACK) == {"b": 1}


@pytest.mark.parametrize(
    "placement, gpw, expected",
    [(PACK, 1.0, 12), (SPREAD, 1.0, 12), (STRICT_PACK, 1.0, 8), (STRICT_SPREAD, 1.0, 2),
     (PACK, 3.0, 3), (STRICT_SPREAD, 5.0, 1), (PACK, 0.5, 24)],
)
def test_cluster_limit_counts_workers_on_node_totals(placement, gpw, expected):
    nodes = [NodeCapacity("a", 8.0, unmanaged=8.0), NodeCapacity("b", 4.0)]
    assert cluster_limit(nodes, gpw, placement) == expected


def test_drain_charges_gpus_that_fit_no_placement_to_the_freest_nodes():
    assert drain({"a": 1.0, "b": 3.0, "c": -1.0}, 3.5) == {"b": 3.0, "a": 0.5}
