"""Elastic leases, the pure parts: a preemption shrinks an elastic lease by the fewest workers
the preemptor needs, freed GPUs are offered back fairly and only when nobody with a better claim
waits, a resize keeps the ledger's GPU-seconds right, and the run's own decision and lines."""
from dataclasses import replace

import pytest

from gpusession.broker.policy import elastic
from gpusession.broker.storage.books import Books, PolicySettings
from gpusession.broker.protocol.notice import Notice, NoticeKind
from gpusession.broker.storage.ledger import Ledger
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
from gpusession.broker.service.reconcile import Withdraw, reconcile
from gpusession.broker.service.rayview import Snapshot
from gpusession.run.caller import resize

LOW, NORMAL, HIGH = Priority.LOW, Priority.NORMAL, Priority.HIGH
NODES = [NodeCapacity("n0", 4.0)]


def req(lease_id, user, workers, *, prio=HIGH, placement=Placement.PACK):
    return Request(lease_id, user, workers, 1.0, prio, placement, float(lease_id))


def elastic_lease(lease_id, workers, *, minimum, full=None, prio=LOW, at=0.0, on=None, **extra):
    return ActiveLease(lease_id, "alice", workers, 1.0, prio, False, at, node_workers=on or {"n0": workers},
                       min_workers=minimum, full_workers=full or workers, **extra)


def run(queue, leases, nodes=NODES):
    return decide(nodes=list(nodes), leases=leases, queue=queue, quotas={},
                  default_quota=Quota(max_priority=HIGH), used_gpu_hours={}, allow_borrowing=False, now=100.0)


# ----- preemption takes only what it needs ---------------------------------------------------------
def test_a_preemptor_shrinks_an_elastic_lease_by_only_the_workers_it_needs():
    decision = run([req(1, "bob", 2)], [elastic_lease(10, 4, minimum=1)])
    assert decision.preemptions == [Preempt(10, 1, "lower priority", shrink_to_workers=2,
                                            give_node_workers={"n0": 2})]
    assert decision.waiting[1].kind is WaitKind.PREEMPTION


def test_an_elastic_lease_never_shrinks_below_its_minimum_and_is_stopped_when_that_is_not_enough():
    decision = run([req(1, "bob", 3)], [elastic_lease(10, 4, minimum=2)])
    assert decision.preemptions == [Preempt(10, 1, "lower priority", shrink_to_workers=None)]


def test_a_shrinking_lease_earmarks_only_what_it_gives_up():
    shrinking = elastic_lease(10, 4, minimum=2, preempted_for=1, giving={"n0": 2})
    # while it shrinks for request 1, a second high request finds nothing else to take
    decision = run([req(1, "bob", 2), req(2, "carol", 2)], [shrinking])
    assert decision.preemptions == [] and decision.grants == []
    assert decision.waiting[1].kind is WaitKind.PREEMPTION and decision.waiting[2].kind is WaitKind.CAPACITY


def test_a_multi_node_elastic_lease_gives_up_workers_where_it_has_the_fewest():
    nodes = [NodeCapacity("n0", 4.0), NodeCapacity("n1", 4.0)]
    other = ActiveLease(11, "dave", 3, 1.0, HIGH, False, 0.0, node_workers={"n1": 3})
    lease = elastic_lease(10, 5, minimum=2, on={"n0": 4, "n1": 1})
    decision = run([req(1, "bob", 2, placement=Placement.STRICT_PACK)], [lease, other], nodes)
    # n1 has 0 free: giving its one worker there frees 1 GPU; strict_pack needs 2 on one node: take 2 on n0
    assert decision.preemptions == [Preempt(10, 1, "lower priority", shrink_to_workers=3,
                                            give_node_workers={"n0": 2})]


def test_fewest_to_give_is_none_when_even_the_minimum_does_not_fit_the_request():
    lease = elastic_lease(10, 4, minimum=3)
    assert elastic.fewest_to_give(req(1, "bob", 2), lease, {"n0": 4.0}, {"n0": 0.0}) is None


# ----- offers to grow back ----------------------------------------------------------------------
def test_free_gpus_are_offered_back_to_a_lease_that_shrank():
    lease = elastic_lease(10, 2, minimum=2, full=4)
    assert elastic.offers([lease], {"n0": 2.0}, []) == [elastic.Offer(10, 4, {"n0": 2})]


def test_offers_share_what_comes_back_between_shrunken_leases_higher_priority_first():
    older = elastic_lease(10, 1, minimum=1, full=4, at=1.0, on={"n0": 1})
    newer = elastic_lease(11, 1, minimum=1, full=4, at=2.0, on={"n0": 1})
    boss = elastic_lease(12, 1, minimum=1, full=2, prio=NORMAL, at=3.0, on={"n0": 1})
    offers = elastic.offers([newer, older, boss], {"n0": 3.0}, [])
    assert offers == [elastic.Offer(12, 2, {"n0": 1}), elastic.Offer(10, 2, {"n0": 1}),
                      elastic.Offer(11, 2, {"n0": 1})]


def test_nothing_is_offered_while_a_request_of_equal_or_higher_priority_waits():
    lease = elastic_lease(10, 2, minimum=2, full=4, prio=NORMAL)
    assert elastic.offers([lease], {"n0": 2.0}, [req(1, "bob", 3, prio=NORMAL)]) == []
    assert elastic.offers([lease], {"n0": 2.0}, [req(1, "bob", 3, prio=LOW)]) == [elastic.Offer(10, 4, {"n0": 2})]


def test_no_offer_to_a_lease_under_notice_or_at_full_size():
    assert elastic.offers([elastic_lease(10, 2, minimum=2, full=4, noticed=True)], {"n0": 2.0}, []) == []
    assert elastic.offers([elastic_lease(10, 4, minimum=2, full=4)], {"n0": 2.0}, []) == []


def test_a_strict_spread_lease_grows_only_onto_nodes_it_does_not_use():
    nodes_free = {"n0": 1.0, "n1": 1.0}
    lease = elastic_lease(10, 1, minimum=1, full=3, on={"n0": 1}, placement=Placement.STRICT_SPREAD)
    assert elastic.offers([lease], nodes_free, []) == [elastic.Offer(10, 2, {"n1": 1})]


# ----- the books and the ledger -------------------------------------------------------------------
@pytest.fixture
def books(tmp_path):
    return Books(Ledger(tmp_path / "ledger.db"), PolicySettings(default_quota=Quota(max_priority=HIGH),
                                                                 preemption_grace_s=30.0))


def _placed(books, lease_id, now):
    books.place(lease_id, {"n0": books.rows[lease_id]["workers"]}, now)


def _request(books, workers, *, prio, now, min_workers=None, user="alice"):
    fields = {"request_id": f"r{books.next_id}", "user": user, "job_id": "01000000", "gpus": float(workers),
              "workers": workers, "gpus_per_worker": 1.0, "min_workers": min_workers, "priority": int(prio),
              "placement": "pack", "max_hold_s": None, "queue_timeout_s": None, "sweep_id": None}
    lease_id, _ = books.add_request(fields, NODES, now)
    books.schedule(NODES, now)
    return lease_id


def test_a_shrink_then_an_offer_then_the_ledger_counts_each_size_for_its_time(books):
    a = _request(books, 4, prio=LOW, min_workers=2, now=0.0)
    _placed(books, a, 0.0)
    b = _request(books, 2, prio=HIGH, now=10.0, user="bob")
    notice = books.rows[a]["notice"]
    assert (notice["kind"], notice["to_workers"], notice["by"]) == ("shrink", 2, {"lease_id": b, "user": "bob",
                                                                                  "priority": "high"})
    books.resize(a, 2, {"n0": 2}, 12.0)
    books.schedule(NODES, 12.0)
    assert books.rows[b]["state"] == "granted" and books.rows[a]["gpus"] == 2
    _placed(books, b, 12.0)
    books.close(b, "finished", 20.0)
    books.schedule(NODES, 20.0)
    offer = books.rows[a]["notice"]
    assert (offer["kind"], offer["to_workers"]) == (NoticeKind.GROW.value, 4)
    books.resize(a, 4, None, 21.0)  # takes the offer
    books.resize(a, 4, {"n0": 4}, 22.0)  # its regrown group landed
    books.close(a, "finished", 30.0)
    closed = books.recent(a)
    assert closed["gpu_seconds"] == pytest.approx(4 * 12 + 2 * 9 + 4 * 9)
    usage = {row["user"]: row["gpu_seconds"] for row in books.ledger.usage_by_user(0.0, 100.0)}
    assert usage == {"alice": pytest.approx(4 * 12 + 2 * 9 + 4 * 9), "bob": pytest.approx(2 * 8)}


def test_an_offer_not_taken_in_time_is_withdrawn(books):
    a = _request(books, 4, prio=LOW, min_workers=2, now=0.0)
    _placed(books, a, 0.0)
    books.resize(a, 4, {"n0": 4}, 1.0)  # no notice: only a report of where it is
    row = dict(books.rows[a], notice={"kind": "grow", "deadline": 5.0, "to_workers": 4})
    actions = reconcile([row], Snapshot(NODES, True), now=6.0, last_seen={}, vanished_since={})
    assert actions == [Withdraw(a)]


# ----- the run's side -------------------------------------------------------------------------------
SHRINK = Notice(NoticeKind.SHRINK, to_workers=2, deadline=103.0,
                by={"lease_id": 12, "user": "alice", "priority": "high"})
GROW = Notice(NoticeKind.GROW)


def test_the_run_never_shrinks_below_min_gpus_nor_grows_past_gpus():
    assert resize.decide(SHRINK, current=4, minimum=2, full=4).workers == 2
    assert resize.decide(replace(SHRINK, to_workers=1), current=4, minimum=2, full=4).workers == 2
    assert resize.decide(replace(GROW, to_workers=6), current=2, minimum=2, full=4).workers == 4
    assert resize.decide(replace(SHRINK, to_workers=3), current=2, minimum=2, full=4).workers == 2


def test_the_cell_says_who_preempted_the_run_and_when_it_is_whole_again():
    after = "the checkpoint after step 340"  # as in a restart's line: where the run goes on
    assert resize.resize_line(SHRINK, old_gpus=4, new_gpus=2, full_gpus=4, at=after) == \
        "preempted by lease 12 (alice, high): 4 -> 2 GPUs from the checkpoint after step 340"
    assert resize.resize_line(GROW, old_gpus=2, new_gpus=4, full_gpus=4, at="the checkpoint after step 610") == \
        "4 GPUs again from the checkpoint after step 610"
    assert resize.resize_line(SHRINK, old_gpus=4, new_gpus=2, full_gpus=4, at=None) == \
        "preempted by lease 12 (alice, high): 4 -> 2 GPUs between runs"  # a held lease with no run going


def test_a_shrink_is_made_before_the_deadline_even_without_a_commit():
    assert resize.deadline_to_act(SHRINK, received=100.0) == pytest.approx(101.5)
    assert resize.deadline_to_act(replace(SHRINK, deadline=130.0), received=100.0) == pytest.approx(128.0)
