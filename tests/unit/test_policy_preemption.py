"""Preemption: who may be preempted, in which order, how many, and the notice period."""
from gpusession.broker.policy.model import (
    ActiveLease,
    NodeCapacity,
    Placement,
    Preempt,
    Priority,
    Quota,
    Request,
    WaitKind,
)
from gpusession.broker.policy.policy import decide

LOW, NORMAL, HIGH = Priority.LOW, Priority.NORMAL, Priority.HIGH


def req(lease_id, user, gpus, *, prio=NORMAL, placement=Placement.PACK, arrival=None):
    return Request(lease_id, user, gpus, 1.0, prio, placement,
                   float(lease_id if arrival is None else arrival))


def lease(lease_id, user, gpus, *, prio=NORMAL, over=False, at=0.0, on="n0", notice=None):
    return ActiveLease(lease_id, user, gpus, 1.0, prio, over, at, node_workers={on: gpus},
                       preempted_for=notice)


def run(queue, leases, *, nodes=(NodeCapacity("n0", 4.0),), quotas=None, borrowing=False):
    return decide(nodes=list(nodes), leases=leases, queue=queue, quotas=quotas or {},
                  default_quota=Quota(max_priority=HIGH), used_gpu_hours={},
                  allow_borrowing=borrowing, now=100.0)


def victims(decision):
    return [(p.victim_id, p.for_lease_id, p.reason) for p in decision.preemptions]


def test_within_quota_request_preempts_over_quota_lease_before_lower_priority_ones():
    leases = [lease(10, "bob", 2, over=True, at=10.0), lease(11, "carol", 2, prio=LOW, at=50.0)]
    decision = run([req(1, "alice", 2)], leases)
    assert decision.preemptions == [Preempt(10, 1, "over quota", shrink_to_workers=None)]
    assert decision.grants == []
    assert decision.waiting[1].kind is WaitKind.PREEMPTION
    assert decision.waiting[1].reason == "waiting for 1 preempted lease to release its GPUs"


def test_preemption_takes_the_newest_lease_first():
    leases = [lease(10, "bob", 2, prio=LOW, at=10.0), lease(11, "carol", 2, prio=LOW, at=50.0)]
    assert victims(run([req(1, "alice", 2)], leases)) == [(11, 1, "lower priority")]


def test_preemption_takes_no_more_leases_than_needed():
    # newest first would take 12 (n0) then 11 (n1); strict_pack needs only n1's 2 GPUs
    nodes = [NodeCapacity("n0", 4.0), NodeCapacity("n1", 4.0)]
    leases = [lease(10, "bob", 3, on="n0"), lease(12, "carol", 1, prio=LOW, at=50.0, on="n0"),
              lease(11, "dave", 2, prio=LOW, at=20.0, on="n1"), lease(13, "erin", 2, on="n1")]
    decision = run([req(1, "alice", 2, placement=Placement.STRICT_PACK)], leases, nodes=nodes)
    assert victims(decision) == [(11, 1, "lower priority")]


def test_preemption_takes_several_small_leases_when_one_is_not_enough():
    leases = [lease(10 + i, f"u{i}", 1, prio=LOW, at=float(i)) for i in range(4)]
    decision = run([req(1, "alice", 3)], leases)
    assert [v for v, _, _ in victims(decision)] == [13, 12, 11]
    assert decision.waiting[1].reason == "waiting for 3 preempted leases to release their GPUs"


def test_never_preempts_a_within_quota_lease_of_equal_priority():
    leases = [lease(10, "bob", 2, at=10.0), lease(11, "carol", 2, at=90.0)]
    decision = run([req(1, "alice", 2)], leases)
    assert decision.preemptions == []
    assert decision.waiting[1].kind is WaitKind.CAPACITY


def test_over_quota_lease_of_higher_priority_is_not_preempted():
    decision = run([req(1, "alice", 2)], [lease(10, "bob", 4, prio=HIGH, over=True)])
    assert decision.preemptions == []


def test_request_beyond_its_quota_preempts_only_strictly_lower_priority():
    leases = [lease(10, "bob", 2, at=10.0), lease(11, "carol", 2, prio=HIGH, over=True, at=90.0),
              lease(12, "alice", 0)]
    quotas = {"alice": Quota(max_gpus=0, max_priority=HIGH)}
    decision = run([req(1, "alice", 2, prio=HIGH)], leases, quotas=quotas, borrowing=True)
    assert victims(decision) == [(10, 1, "lower priority")]


def test_request_beyond_quota_without_borrowing_preempts_nothing():
    leases = [lease(10, "bob", 3, prio=LOW), lease(11, "alice", 1)]
    quotas = {"alice": Quota(max_gpus=1, max_priority=HIGH)}
    decision = run([req(1, "alice", 1, prio=HIGH)], leases, quotas=quotas)
    assert decision.preemptions == []
    assert decision.waiting[1].kind is WaitKind.QUOTA


def test_leases_under_notice_are_not_chosen_again_and_the_request_waits_for_them():
    leases = [lease(10, "bob", 2, prio=LOW, notice=1), lease(11, "carol", 2, prio=LOW, at=5.0)]
    decision = run([req(1, "alice", 2)], leases)
    assert decision.preemptions == []
    assert decision.waiting[1].kind is WaitKind.PREEMPTION


def test_gpus_freed_for_a_preempting_request_go_to_it_not_to_later_requests():
    # bob's lease releases 2 GPUs for alice, who also counts on the 2 free ones
    leases = [lease(10, "bob", 2, prio=LOW, notice=1)]
    decision = run([req(1, "alice", 4), req(2, "carol", 1)], leases)
    assert decision.grants == []
    assert decision.waiting[1].reason == "waiting for 1 preempted lease to release its GPUs"
    assert decision.waiting[2].kind is WaitKind.CAPACITY


def test_request_is_granted_once_its_victims_released():
    queue = [req(1, "alice", 4), req(2, "carol", 1)]
    while_releasing = run(queue, [lease(10, "bob", 2, prio=LOW, notice=1)])
    assert while_releasing.grants == [] and while_releasing.waiting[1].kind is WaitKind.PREEMPTION
    released = run(queue, [])  # bob's lease is gone
    assert [g.lease_id for g in released.grants] == [1] and released.waiting[2].kind is WaitKind.CAPACITY


def test_notice_for_a_request_that_left_the_queue_earmarks_nothing():
    leases = [lease(10, "bob", 2, prio=LOW, notice=99)]
    decision = run([req(1, "alice", 2)], leases)
    assert [g.lease_id for g in decision.grants] == [1]


def test_preemption_stops_after_the_first_request_it_cannot_help():
    # alice needs 4: taking carol's 2 is not enough, so dave may not take them either
    leases = [lease(10, "bob", 2, at=10.0), lease(11, "carol", 2, prio=LOW, at=20.0)]
    decision = run([req(1, "alice", 4), req(2, "dave", 2)], leases)
    assert decision.preemptions == []
    assert decision.waiting[1].position == 1


def test_several_requests_may_preempt_in_one_decision():
    leases = [lease(10, "bob", 2, prio=LOW, at=10.0), lease(11, "carol", 2, prio=LOW, at=20.0)]
    decision = run([req(1, "alice", 2), req(2, "dave", 2)], leases)
    assert victims(decision) == [(11, 1, "lower priority"), (10, 2, "lower priority")]


def test_a_users_second_request_does_not_preempt_past_their_quota():
    leases = [lease(10, "bob", 2, prio=LOW, at=10.0), lease(11, "carol", 2, prio=LOW, at=20.0)]
    queue = [req(1, "alice", 2), req(2, "alice", 2)]
    decision = run(queue, leases, quotas={"alice": Quota(max_gpus=2)})
    assert victims(decision) == [(11, 1, "lower priority")]
    assert decision.waiting[2].kind is WaitKind.QUOTA


def test_higher_priority_request_preempts_lower_priority_within_quota_lease():
    decision = run([req(1, "alice", 4, prio=HIGH)], [lease(10, "bob", 4, at=10.0)])
    assert victims(decision) == [(10, 1, "lower priority")]


def test_borrowed_lease_is_preempted_first_for_a_user_back_within_quota():
    # bob borrowed 2 GPUs; alice is within her quota and wants them
    leases = [lease(10, "bob", 2), lease(11, "bob", 2, over=True, at=30.0)]
    decision = run([req(1, "alice", 2)], leases, quotas={"bob": Quota(max_gpus=2)}, borrowing=True)
    assert victims(decision) == [(11, 1, "over quota")]
