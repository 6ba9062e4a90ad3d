"""Reconciliation with Ray's view: every way a caller vanishes closes its lease, nothing else does."""
from __future__ import annotations

from gpusession.broker.policy.model import Priority
from gpusession.broker.service.rayview import GroupState, Snapshot
from gpusession.broker.service.reconcile import Close, Force, MarkPlaced, MarkVanished, Timeouts, reconcile

NOW = 1_000.0
TIMEOUTS = Timeouts(claim_s=15, heartbeat_s=5, vanish_s=10)


def _row(lease_id=1, state="placed", **extra):
    row = {"id": lease_id, "state": state, "job_id": "0a000000", "granted_at": NOW - 60,
           "priority": Priority.NORMAL, "max_hold_s": None, "notice": None}
    row.update(extra)
    return row


def _snapshot(groups=None, dead_jobs=None, live_jobs=()):
    return Snapshot(nodes=[], logical=True, groups=groups or {}, dead_jobs=dead_jobs or {},
                    live_jobs=frozenset(live_jobs))


def _group(state="CREATED"):
    return GroupState("pg1", state, {"node-a": 2}, {"node-a": 2.0})


def _run(rows, snapshot, *, last_seen=None, vanished=None):
    return reconcile(rows, snapshot, now=NOW, last_seen=last_seen or {}, vanished_since=vanished or {},
                     timeouts=TIMEOUTS)


def test_a_placed_lease_with_its_group_present_needs_nothing():
    assert _run([_row()], _snapshot({1: _group()})) == []


def test_a_group_gone_under_a_living_caller_waits_for_its_release_before_closing_as_lost():
    assert _run([_row()], _snapshot()) == [MarkVanished(1, NOW)]
    assert _run([_row()], _snapshot(), vanished={1: NOW - 5}) == []  # the caller is still releasing
    assert _run([_row()], _snapshot(), vanished={1: NOW - 10}) == [Close(1, "lost", NOW - 10)]


def test_a_vanished_lease_of_a_dead_job_is_closed_at_once_at_the_jobs_real_end():
    snapshot = _snapshot({1: _group("REMOVED")}, dead_jobs={"0a000000": NOW - 30})
    assert _run([_row()], snapshot) == [Close(1, "caller gone", NOW - 30)]


def test_a_grant_whose_group_was_created_is_marked_placed_with_its_nodes():
    assert _run([_row(state="granted")], _snapshot({1: _group()})) == [MarkPlaced(1, {"node-a": 2})]


def test_a_grant_nobody_claimed_expires_after_the_claim_timeout():
    fresh = _row(state="granted", granted_at=NOW - 5)
    stale = _row(lease_id=2, state="granted", granted_at=NOW - 20)
    assert _run([fresh, stale], _snapshot()) == [Force(2, "expired")]


def test_a_grant_of_a_dead_job_is_closed_at_once():
    assert _run([_row(state="granted", granted_at=NOW - 1)], _snapshot(dead_jobs={"0a000000": NOW - 1})) == [
        Close(1, "caller gone", NOW)]


def test_a_queued_request_is_dropped_when_its_job_died_or_it_stopped_polling():
    rows = [_row(1, "queued"), _row(2, "queued", job_id="0b000000"), _row(3, "queued")]
    actions = _run(rows, _snapshot(dead_jobs={"0b000000": NOW}), last_seen={1: NOW - 1, 3: NOW - 6})
    assert actions == [Close(2, "caller gone", NOW), Close(3, "caller gone", NOW)]


def test_a_queued_request_of_a_running_job_outlasts_a_late_poll_but_not_a_long_silence():
    from gpusession.broker.service.reconcile import LIVE_CALLER_SILENCE_S

    live = _snapshot(live_jobs={"0a000000"})
    late = _run([_row(1, "queued")], live, last_seen={1: NOW - 6})  # over the 5 s heartbeat: a loaded machine
    hung = _run([_row(1, "queued")], live, last_seen={1: NOW - LIVE_CALLER_SILENCE_S - 1})
    unknown_job = _run([_row(1, "queued", job_id="0c000000")], live, last_seen={1: NOW - 6})
    no_job = _run([_row(1, "queued", job_id=None)], live, last_seen={1: NOW - 6})
    assert late == []
    assert hung == [Close(1, "caller gone", NOW)]
    assert unknown_job == no_job == [Close(1, "caller gone", NOW)]


def test_a_notice_past_its_deadline_forces_the_lease_off_its_gpus():
    row = _row(notice={"kind": "preempt", "deadline": NOW - 0.1, "reason_code": "preempted"})
    assert _run([row], _snapshot({1: _group()})) == [Force(1, "preempted")]


def test_a_run_far_past_its_declared_timeout_is_forced_counting_from_its_placement():
    from gpusession.broker.service.reconcile import RUN_DEADLINE_SLACK_S

    late = _row(max_hold_s=10, granted_at=NOW - 2000, placed_at=NOW - 11 - RUN_DEADLINE_SLACK_S)
    in_setup = _row(lease_id=2, max_hold_s=10, granted_at=NOW - 2000, placed_at=NOW - 20)
    assert _run([late, in_setup], _snapshot({1: _group(), 2: _group()})) == [Force(1, "timeout")]


def test_a_group_rescheduling_after_a_node_loss_is_not_treated_as_vanished():
    assert _run([_row()], _snapshot({1: _group("RESCHEDULING")})) == []


def test_a_lost_node_lends_nothing_but_what_active_leases_still_hold_there():
    from gpusession.broker.policy.model import ActiveLease, NodeCapacity

    # Read while lease 7's group still held 2 GPUs on the lost node "b"; lease 7 has ended since.
    snapshot = Snapshot(nodes=[NodeCapacity("a", 2.0), NodeCapacity("b", 2.0, 0.0)], logical=True, lost={"b": "10.0.0.2"})
    assert snapshot.nodes_for([]) == [NodeCapacity("a", 2.0), NodeCapacity("b", 2.0, 2.0)]
    holder = ActiveLease(8, "u", 2, 0.5, Priority.NORMAL, False, 0.0, node_workers={"a": 2, "b": 2})
    assert snapshot.nodes_for([holder]) == [NodeCapacity("a", 2.0), NodeCapacity("b", 2.0, 1.0)]
    healthy = Snapshot(nodes=[NodeCapacity("a", 2.0, 0.5)], logical=True)
    assert healthy.nodes_for([]) == healthy.nodes  # only lost nodes change
