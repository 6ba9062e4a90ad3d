"""Backfill without starvation, and borrowing idle GPUs (SPEC section 4). Virtual time only."""
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


def req(lease_id, user, gpus, *, prio=NORMAL, arrival=None, hold=None):
    return Request(lease_id, user, gpus, 1.0, prio, Placement.PACK,
                   float(lease_id if arrival is None else arrival), max_hold_s=hold)


def lease(lease_id, user, gpus, *, at=0.0, ends=None, over=False, prio=NORMAL):
    return ActiveLease(lease_id, user, gpus, 1.0, prio, over, at, ends_by=ends,
                       node_workers={"n0": gpus})


def run(queue, leases, *, gpus=4.0, quotas=None, borrowing=False, now=100.0):
    return decide(nodes=[NodeCapacity("n0", gpus)], leases=leases, queue=queue, quotas=quotas or {},
                  default_quota=Quota(max_priority=HIGH), used_gpu_hours={},
                  allow_borrowing=borrowing, now=now)


def granted_ids(decision):
    return [g.lease_id for g in decision.grants]


# bob holds 3 of 4 GPUs until t=1000; alice (head) needs all 4
BUSY_UNTIL_1000 = [lease(10, "bob", 3, ends=1000.0)]


def test_small_request_backfills_when_it_ends_before_the_head_can_start():
    decision = run([req(1, "alice", 4), req(2, "carol", 1, hold=500.0)], BUSY_UNTIL_1000)
    assert granted_ids(decision) == [2]
    assert decision.waiting[1].reason == (
        "waiting for capacity: 4 of 4 GPUs in use; next in line, expected within 15 min")


def test_small_request_waits_when_it_would_delay_the_head():
    decision = run([req(1, "alice", 4), req(2, "carol", 1, hold=1000.0)], BUSY_UNTIL_1000)
    assert decision.grants == []
    assert decision.waiting[2].position == 2
    assert decision.waiting[2].reason == (
        "waiting for capacity: 3 of 4 GPUs in use; "
        "the free ones are held for a request ahead of this one")


def test_request_with_unknown_hold_never_backfills_into_gpus_the_head_needs():
    decision = run([req(1, "alice", 4), req(2, "carol", 1)], BUSY_UNTIL_1000)
    assert decision.grants == []


def test_backfill_may_use_gpus_the_head_will_not_need_at_its_start():
    # 8 GPUs, bob holds 4 until t=1000, alice needs 6: 2 of the 4 free GPUs are spare at t=1000
    leases = [lease(10, "bob", 4, ends=1000.0)]
    queue = [req(1, "alice", 6), req(2, "carol", 2), req(3, "dave", 1)]
    decision = run(queue, leases, gpus=8.0)
    assert granted_ids(decision) == [2]  # dave's GPU would be one too many at t=1000
    assert decision.waiting[3].position == 2


def test_unknown_shadow_time_allows_backfill_that_leaves_room_in_the_worst_case():
    # nobody declared an end: backfill only what leaves the head room once all else ended
    leases = [lease(10, "bob", 5)]
    decision = run([req(1, "alice", 6), req(2, "carol", 2), req(3, "dave", 1)], leases, gpus=8.0)
    assert granted_ids(decision) == [2]
    assert decision.waiting[1].reason == "waiting for capacity: 7 of 8 GPUs in use; next in line"


def test_declared_hold_does_not_help_when_the_head_start_is_unknown():
    # bob may end any second: even a 60-second job could delay alice
    decision = run([req(1, "alice", 4), req(2, "carol", 1, hold=60.0)], [lease(10, "bob", 3)])
    assert decision.grants == []


def test_earlier_backfills_still_count_against_the_head_in_later_decisions():
    # carol was backfilled after alice arrived (t=1); with no declared end she counts as staying
    leases = [lease(10, "bob", 4), lease(11, "carol", 2, at=50.0)]
    decision = run([req(1, "alice", 6), req(2, "dave", 2)], leases, gpus=8.0)
    assert decision.grants == []


def test_large_request_is_not_starved_by_stream_of_small_ones():
    """8 GPUs busy with 1-GPU jobs; a 6-GPU request arrives; a new 1-GPU job arrives every 2 s
    and each runs 30 s, with no declared end. The big request starts once the jobs that were
    running when it arrived have ended, instead of waiting for a gap that never comes."""
    now, next_id = 0.0, 100
    ends_at: dict[int, float] = {}
    leases = [lease(i, f"u{i}", 1, at=-float(i)) for i in range(8)]
    for lease_ in leases:
        ends_at[lease_.lease_id] = 30.0 - lease_.lease_id * 3
    queue = [req(1, "alice", 6, arrival=1.0)]
    big_granted_at = None
    while now < 300 and big_granted_at is None:
        now += 1.0
        leases = [held for held in leases if ends_at[held.lease_id] > now]
        if now % 2 == 0:
            queue.append(req(next_id, f"s{next_id}", 1, arrival=now))
            next_id += 1
        decision = run(queue, leases, gpus=8.0, now=now)
        for grant in decision.grants:
            request = next(r for r in queue if r.lease_id == grant.lease_id)
            if request.lease_id == 1:
                big_granted_at = now
            leases.append(lease(request.lease_id, request.user, request.workers, at=now))
            ends_at[request.lease_id] = now + 30.0
        done = {g.lease_id for g in decision.grants}
        queue = [r for r in queue if r.lease_id not in done]
    assert big_granted_at is not None and big_granted_at <= 35.0


def test_requests_waiting_for_quota_do_not_reserve_capacity():
    leases = [lease(10, "alice", 1)]
    quotas = {"alice": Quota(max_gpus=3)}
    decision = run([req(1, "alice", 3), req(2, "bob", 2)], leases, quotas=quotas)
    assert granted_ids(decision) == [2]
    assert decision.waiting[1].kind is WaitKind.QUOTA


def test_head_that_could_not_fit_even_when_all_leases_end_does_not_block_others():
    # 3 of 4 GPUs are used outside gpusession: alice's 4-GPU request must wait, bob need not
    nodes = [NodeCapacity("n0", 4.0, unmanaged=3.0)]
    queue = [req(1, "alice", 4), req(2, "bob", 1)]
    decision = decide(nodes=nodes, leases=[], queue=queue, quotas={},
                      default_quota=Quota(), used_gpu_hours={}, allow_borrowing=False, now=0.0)
    assert granted_ids(decision) == [2]


# --- borrowing -----------------------------------------------------------------------------

ALICE_MAX_1 = {"alice": Quota(max_gpus=1, max_priority=HIGH)}


def test_borrowing_grants_idle_gpus_marked_over_quota():
    decision = run([req(1, "alice", 2)], [lease(10, "alice", 1)], quotas=ALICE_MAX_1,
                   borrowing=True)
    assert [(g.lease_id, g.over_quota) for g in decision.grants] == [(1, True)]


def test_without_borrowing_a_request_beyond_quota_waits_for_quota():
    decision = run([req(1, "alice", 1)], [lease(10, "alice", 1)], quotas=ALICE_MAX_1,
                   borrowing=False)
    assert decision.grants == []
    assert decision.waiting[1].reason == "waiting for quota: alice holds 1 of max 1 GPU"


def test_borrower_goes_after_requests_within_quota_of_the_same_priority():
    leases = [lease(10, "alice", 1), lease(11, "carol", 1)]
    queue = [req(1, "alice", 2), req(2, "bob", 2)]
    decision = run(queue, leases, quotas=ALICE_MAX_1, borrowing=True)
    assert granted_ids(decision) == [2]
    assert decision.waiting[1].position == 1
    assert decision.waiting[1].reason == (
        "waiting for quota: alice holds 1 of max 1 GPU and no GPUs are idle to borrow")


def test_borrower_of_higher_priority_goes_before_lower_priority_within_quota():
    leases = [lease(10, "alice", 1), lease(11, "carol", 1)]
    queue = [req(1, "alice", 2, prio=HIGH, arrival=5), req(2, "bob", 2, arrival=1)]
    decision = run(queue, leases, quotas=ALICE_MAX_1, borrowing=True)
    assert [(g.lease_id, g.over_quota) for g in decision.grants] == [(1, True)]


def test_borrower_does_not_take_gpus_reserved_for_the_head():
    queue = [req(1, "carol", 4), req(2, "alice", 1)]
    leases = BUSY_UNTIL_1000 + [lease(11, "alice", 0)]
    decision = run(queue, leases, quotas={"alice": Quota(max_gpus=0)}, borrowing=True)
    assert decision.grants == []
    assert decision.waiting[2].kind is WaitKind.QUOTA


def test_borrower_with_a_short_declared_hold_may_backfill():
    queue = [req(1, "carol", 4), req(2, "alice", 1, hold=60.0)]
    decision = run(queue, BUSY_UNTIL_1000, quotas={"alice": Quota(max_gpus=0)}, borrowing=True)
    assert [(g.lease_id, g.over_quota) for g in decision.grants] == [(2, True)]
