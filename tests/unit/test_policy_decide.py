"""decide(): gang admission, quotas, order, capacity accounting and what waiting users read.

Time is passed in (`now`); nothing sleeps. Backfill and preemption have their own files.
"""
import pytest

from gpusession.broker.policy.model import (
    ActiveLease,
    NodeCapacity,
    Placement,
    Priority,
    Quota,
    Request,
    WaitKind,
)
from gpusession.broker.policy.policy import decide

LOW, NORMAL, HIGH = Priority.LOW, Priority.NORMAL, Priority.HIGH
ONE_NODE = [NodeCapacity("n0", 4.0)]


def req(lease_id, user="alice", gpus=1, *, gpw=1.0, prio=NORMAL, placement=Placement.PACK,
        arrival=None, hold=None):
    return Request(lease_id=lease_id, user=user, workers=round(gpus / gpw), gpus_per_worker=gpw,
                   priority=prio, placement=placement,
                   arrival=float(lease_id if arrival is None else arrival), max_hold_s=hold)


def lease(lease_id, user="bob", gpus=1, *, gpw=1.0, prio=NORMAL, over=False, at=0.0, ends=None,
          on="n0", notice=None, placement=Placement.PACK):
    workers = round(gpus / gpw)
    where = None if on is None else (on if isinstance(on, dict) else {on: workers})
    return ActiveLease(lease_id=lease_id, user=user, workers=workers, gpus_per_worker=gpw,
                       priority=prio, over_quota=over, granted_at=at, ends_by=ends,
                       node_workers=where, preempted_for=notice, placement=placement)


def run(queue, *, nodes=ONE_NODE, leases=(), quotas=None, default=Quota(max_priority=HIGH),
        hours=None, borrowing=False, now=100.0):
    return decide(nodes=nodes, leases=list(leases), queue=list(queue), quotas=quotas or {},
                  default_quota=default, used_gpu_hours=hours or {}, allow_borrowing=borrowing,
                  now=now)


def granted(decision):
    return {g.lease_id: dict(g.node_workers) for g in decision.grants}


def test_request_that_fits_is_granted_with_its_placement():
    decision = run([req(1, gpus=2)])
    assert granted(decision) == {1: {"n0": 2}}
    assert decision.grants[0].over_quota is False
    assert decision.waiting == {}


def test_gang_gets_all_its_workers_or_waits_holding_nothing():
    decision = run([req(1, gpus=4), req(2, gpus=1)], leases=[lease(10, gpus=1)])
    assert 1 not in granted(decision)
    assert decision.waiting[1].kind is WaitKind.CAPACITY


def test_waiting_for_capacity_reason_counts_gpus_in_use():
    decision = run([req(1, gpus=2)], leases=[lease(10, gpus=3)])
    assert decision.waiting[1].reason.startswith("waiting for capacity: 3 of 4 GPUs in use")


def test_request_beyond_quota_waits_for_quota_with_reason():
    decision = run([req(1, gpus=1)], nodes=[NodeCapacity("n0", 8.0)],
                   leases=[lease(10, user="alice", gpus=2)], quotas={"alice": Quota(max_gpus=2)})
    assert decision.grants == []
    assert decision.waiting[1].kind is WaitKind.QUOTA
    assert decision.waiting[1].reason == "waiting for quota: alice holds 2 of max 2 GPUs"


def test_over_quota_leases_do_not_count_against_max_gpus():
    decision = run([req(1, gpus=2)], nodes=[NodeCapacity("n0", 8.0)],
                   leases=[lease(10, user="alice", gpus=3, over=True)],
                   quotas={"alice": Quota(max_gpus=2)})
    assert granted(decision) == {1: {"n0": 2}}


def test_default_quota_applies_to_users_without_a_row():
    decision = run([req(1, user="zoe", gpus=1)], leases=[lease(10, user="zoe")],
                   default=Quota(max_gpus=1))
    assert decision.waiting[1].reason == "waiting for quota: zoe holds 1 of max 1 GPU"


def test_higher_priority_goes_first_and_equal_priority_by_arrival():
    queue = [req(1, prio=LOW, gpus=4), req(2, gpus=4, arrival=5), req(3, gpus=4, arrival=3),
             req(4, prio=HIGH, gpus=4, arrival=9)]
    decision = run(reversed(queue), leases=[lease(10, gpus=4, prio=HIGH)])
    assert {i: w.position for i, w in decision.waiting.items()} == {4: 1, 3: 2, 2: 3, 1: 4}


def test_first_in_order_gets_the_gpus():
    decision = run([req(1, "bob", gpus=2, arrival=2), req(2, "carol", gpus=2, prio=HIGH, arrival=9),
                    req(3, "dave", gpus=2, arrival=1)], leases=[lease(10, gpus=2)])
    assert list(granted(decision)) == [2]


def test_positions_count_only_requests_still_waiting():
    decision = run([req(1, gpus=1), req(2, gpus=4), req(3, gpus=4)])
    assert list(granted(decision)) == [1]
    assert [decision.waiting[i].position for i in (2, 3)] == [1, 2]


def test_several_requests_are_granted_in_one_decision_without_overcommitting():
    decision = run([req(i, user=f"u{i}", gpus=1) for i in range(1, 7)])
    assert list(granted(decision)) == [1, 2, 3, 4]
    assert [decision.waiting[i].position for i in (5, 6)] == [1, 2]


def test_in_quota_usage_grows_with_grants_of_the_same_decision():
    decision = run([req(1, gpus=1), req(2, gpus=1), req(3, gpus=1)],
                   quotas={"alice": Quota(max_gpus=2)})
    assert list(granted(decision)) == [1, 2]
    assert decision.waiting[3].reason == "waiting for quota: alice holds 2 of max 2 GPUs"


def test_spent_budget_at_decision_time_rejects_with_quota_exceeded():
    decision = run([req(1), req(2, user="bob")], quotas={"alice": Quota(gpu_hours=10)},
                   hours={"alice": 10.0, "bob": 99.0})
    assert [(r.lease_id, r.error) for r in decision.rejections] == [(1, "QuotaExceeded")]
    assert "alice has used 10.0 of 10 GPU-hours" in decision.rejections[0].message
    assert list(granted(decision)) == [2]


def test_running_lease_is_never_stopped_for_budget():
    # alice spent 50 of her 1 GPU-hour, but her running lease is within max_gpus and of bob's
    # priority: bob waits for capacity, nothing is preempted or rejected
    decision = run([req(1, user="bob", gpus=4)], leases=[lease(10, user="alice", gpus=4)],
                   quotas={"alice": Quota(gpu_hours=1)}, hours={"alice": 50.0})
    assert decision.preemptions == [] and decision.rejections == [] and decision.grants == []
    assert decision.waiting[1].kind is WaitKind.CAPACITY


def test_priority_above_a_lowered_max_priority_is_rejected_at_decision_time():
    decision = run([req(1, prio=HIGH)], quotas={"alice": Quota(max_priority=NORMAL)})
    assert decision.rejections[0].error == "QuotaExceeded"
    assert decision.waiting == {}


def test_request_above_a_lowered_max_gpus_is_rejected_without_borrowing():
    decision = run([req(1, gpus=3)], quotas={"alice": Quota(max_gpus=2)})
    assert decision.rejections[0].error == "Infeasible"
    assert "alice may hold 2" in decision.rejections[0].message


def test_every_queued_request_is_granted_rejected_or_waiting():
    queue = [req(1, gpus=2), req(2, gpus=4), req(3, prio=HIGH), req(4, user="bob", gpus=1)]
    decision = run(queue, quotas={"bob": Quota(gpu_hours=1)}, hours={"bob": 2.0})
    rejected = {r.lease_id for r in decision.rejections}
    outcomes = [set(granted(decision)), rejected, set(decision.waiting)]
    assert sorted(i for o in outcomes for i in o) == [1, 2, 3, 4]


# --- capacity accounting -------------------------------------------------------------------


def test_unplaced_grants_are_counted_before_the_queue():
    decision = run([req(1, gpus=2)], leases=[lease(10, gpus=3, on=None)])
    assert decision.grants == []
    assert decision.waiting[1].reason.startswith("waiting for capacity: 3 of 4 GPUs in use")


def test_unplaced_grants_are_simulated_with_their_placement():
    nodes = [NodeCapacity("n0", 2.0), NodeCapacity("n1", 2.0)]
    spread = lease(10, gpus=2, on=None, placement=Placement.STRICT_SPREAD)  # one GPU on each node
    decision = run([req(1, gpus=2, placement=Placement.STRICT_PACK)], nodes=nodes, leases=[spread])
    assert decision.grants == []
    packed = lease(10, gpus=2, on=None, placement=Placement.STRICT_PACK)
    decision = run([req(1, gpus=2, placement=Placement.STRICT_PACK)], nodes=nodes, leases=[packed])
    assert len(decision.grants) == 1


def test_unmanaged_gpus_are_never_handed_out():
    nodes = [NodeCapacity("n0", 4.0, unmanaged=3.0)]
    decision = run([req(1, gpus=2), req(2, user="bob", gpus=1)], nodes=nodes)
    assert list(granted(decision)) == [2]
    assert decision.waiting[1].reason.startswith("waiting for capacity: 4 of 4 GPUs in use")


def test_lease_placed_on_a_vanished_node_is_ignored():
    decision = run([req(1, gpus=4)], leases=[lease(10, gpus=4, on="gone")])
    assert granted(decision) == {1: {"n0": 4}}


def test_fractional_workers_share_gpus():
    nodes = [NodeCapacity("n0", 1.0)]
    decision = run([req(1, gpus=0.5, gpw=0.25), req(2, user="bob", gpus=0.5, gpw=0.5),
                    req(3, user="carol", gpus=0.25, gpw=0.25)], nodes=nodes)
    assert granted(decision) == {1: {"n0": 2}, 2: {"n0": 1}}
    assert decision.waiting[3].reason.startswith("waiting for capacity: 1 of 1 GPUs in use")


def test_fractional_quota_counts_fractions():
    halves = [req(i, gpus=0.5, gpw=0.5) for i in (1, 2, 3)]
    decision = run(halves, quotas={"alice": Quota(max_gpus=1.0)})
    assert list(granted(decision)) == [1, 2]
    assert decision.waiting[3].kind is WaitKind.QUOTA


@pytest.mark.parametrize(
    "placement, expected",
    [
        (Placement.STRICT_PACK, None),
        (Placement.PACK, {"n0": 2, "n1": 2}),
        (Placement.SPREAD, {"n0": 2, "n1": 2}),
        (Placement.STRICT_SPREAD, None),
    ],
)
def test_placement_is_judged_per_node(placement, expected):
    nodes = [NodeCapacity("n0", 4.0), NodeCapacity("n1", 4.0)]
    busy = [lease(10, gpus=2, on="n0"), lease(11, gpus=2, on="n1")]
    decision = run([req(1, gpus=4, placement=placement)], nodes=nodes, leases=busy)
    assert granted(decision).get(1) == expected


def test_strict_spread_takes_one_gpu_on_each_distinct_node():
    nodes = [NodeCapacity(f"n{i}", 2.0) for i in range(3)]
    decision = run([req(1, gpus=3, placement=Placement.STRICT_SPREAD)], nodes=nodes,
                   leases=[lease(10, gpus=2, on="n1")])
    assert decision.grants == []
    decision = run([req(1, gpus=2, placement=Placement.STRICT_SPREAD)], nodes=nodes,
                   leases=[lease(10, gpus=2, on="n1")])
    assert granted(decision) == {1: {"n0": 1, "n2": 1}}


def test_pack_grant_prefers_the_fullest_node_that_fits():
    nodes = [NodeCapacity("n0", 8.0), NodeCapacity("n1", 8.0)]
    decision = run([req(1, gpus=2)], nodes=nodes, leases=[lease(10, gpus=5, on="n1")])
    assert granted(decision) == {1: {"n1": 2}}


def test_decision_is_deterministic():
    queue = [req(i, user=f"u{i % 3}", gpus=1 + i % 3, prio=Priority(i % 3)) for i in range(1, 30)]
    leases = [lease(100, gpus=2, over=True), lease(101, gpus=1, prio=LOW, at=5.0)]
    forward = run(queue, leases=leases, borrowing=True)
    assert forward == run(list(reversed(queue)), leases=leases, borrowing=True)
