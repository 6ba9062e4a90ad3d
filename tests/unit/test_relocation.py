"""A run that lost a host restarts at its size only where GPUs are free now: the pure decision
(broker/policy/relocation.py) of where the lost host's workers go, or why they cannot, in numbers."""
from gpusession.broker.policy.model import Placement
from gpusession.broker.policy.relocation import relocate

TOTAL = {"x": 2.0, "y": 2.0, "z": 2.0}


def test_the_lost_hosts_workers_move_to_free_gpus_and_the_others_stay():
    moved = relocate({"x": 1, "y": 1}, {"x"}, free_by_node={"x": 1.0, "y": 1.0}, total_by_node={"x": 2.0, "y": 2.0},
                     gpus_per_worker=1.0, placement=Placement.SPREAD)
    assert moved.node_workers == {"y": 2} and moved.why == ""
    moved = relocate({"x": 2, "y": 2}, {"x"}, free_by_node={"x": 0.0, "y": 0.0, "z": 2.0}, total_by_node=TOTAL,
                     gpus_per_worker=1.0, placement="pack")
    assert moved.node_workers == {"y": 2, "z": 2}


def test_a_restart_the_remaining_hosts_could_never_hold_says_so():
    refused = relocate({"x": 2, "y": 2}, {"x"}, free_by_node={"x": 0.0, "y": 0.0},
                       total_by_node={"x": 2.0, "y": 2.0}, gpus_per_worker=1.0, placement="spread")
    assert refused.node_workers is None
    assert refused.why == "the hosts that remain have 2 GPUs in all, fewer than the 4 the run needs"


def test_no_free_gpus_now_fails_with_the_numbers_and_what_to_do():
    # the hosts that remain could hold the run, but another lease uses z's GPUs now
    refused = relocate({"x": 2, "y": 2}, {"x"}, free_by_node={"x": 0.0, "y": 0.0, "z": 1.0}, total_by_node=TOTAL,
                       gpus_per_worker=1.0, placement="spread")
    assert refused.node_workers is None
    assert refused.why == ("the hosts that remain have 1 GPU free, fewer than the 2 the run lost with the host "
                           "(it needs 4): make the run elastic (min_gpus=2) to go on with what remains, or run it "
                           "again when GPUs are free")


def test_a_lost_host_is_never_a_place_to_move_to_even_if_it_looks_free():
    refused = relocate({"x": 1, "y": 1}, {"x"}, free_by_node={"x": 2.0, "y": 0.0}, total_by_node={"x": 2.0, "y": 2.0},
                       gpus_per_worker=1.0, placement="spread")
    assert refused.node_workers is None and "have 0 GPUs free" in refused.why


def test_strict_spread_moves_only_to_hosts_without_a_worker_and_strict_pack_keeps_one_host():
    refused = relocate({"x": 1, "y": 1}, {"x"}, free_by_node={"x": 1.0, "y": 1.0}, total_by_node=TOTAL,
                       gpus_per_worker=1.0, placement="strict_spread")
    assert refused.node_workers is None
    assert refused.why.startswith("the hosts that remain have 1 GPU free, but not where placement='strict_spread' "
                                  "can put 1 more worker of 1 GPU: ")
    moved = relocate({"x": 1, "y": 1}, {"x"}, free_by_node={"x": 1.0, "y": 1.0, "z": 2.0}, total_by_node=TOTAL,
                     gpus_per_worker=1.0, placement="strict_spread")
    assert moved.node_workers == {"y": 1, "z": 1}
    moved = relocate({"x": 2}, {"x"}, free_by_node={"x": 0.0, "y": 1.0, "z": 2.0}, total_by_node=TOTAL,
                     gpus_per_worker=1.0, placement="strict_pack")
    assert moved.node_workers == {"z": 2}


def test_every_host_of_the_run_lost_suggests_no_elastic_run_and_fractional_workers_fit_by_share():
    refused = relocate({"x": 2}, {"x"}, free_by_node={"y": 1.0}, total_by_node={"x": 2.0, "y": 2.0},
                       gpus_per_worker=1.0, placement="pack")
    assert refused.why == ("the hosts that remain have 1 GPU free, fewer than the 2 the run lost with the host "
                           "(it needs 2): run it again when GPUs are free")
    moved = relocate({"x": 2, "y": 2}, {"x"}, free_by_node={"y": 1.0}, total_by_node={"x": 1.0, "y": 2.0},
                     gpus_per_worker=0.5, placement="pack")
    assert moved.node_workers == {"y": 4}
