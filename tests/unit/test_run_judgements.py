"""The follower's judgements are pure: which failure ends an attempt, whom a lost worker blames,
what the clock and a broker notice make the run do (run/caller/judgements.py), and how the controller
tells an attempt's ends apart (run/caller/outcome.py)."""
from __future__ import annotations

import pytest

from gpusession.broker.protocol.notice import Notice, NoticeKind
from gpusession.errors import LeaseRevoked, Preempted, RunCancelled, RunTimeout, WorkerFailed
from gpusession.run.caller import judgements as judge
from gpusession.run.endings import end_reason, terminal_state
from gpusession.run.caller.outcome import Failed, Finished, Resize, Stopped, TimedOut
from gpusession.run.policies import Fault, FaultKind, RunState

ECHO, OWN = True, False


def failures(*collateral: bool) -> list[judge.Failure]:
    return [judge.Failure(c, i) for i, c in enumerate(collateral)]


def test_a_ranks_own_failure_ends_the_attempt_at_once_even_after_an_echo():
    assert judge.root_cause(failures(ECHO, OWN), waited_s=0.0, grace_s=1.0, ranks_left=2) == 1


def test_an_echo_alone_waits_for_the_root_cause_until_the_grace_passes():
    assert judge.root_cause(failures(ECHO), waited_s=0.5, grace_s=1.0, ranks_left=1) is None
    assert judge.root_cause(failures(ECHO, ECHO), waited_s=1.0, grace_s=1.0, ranks_left=1) == 0


def test_an_echo_ends_the_attempt_when_no_rank_is_left_to_report():
    assert judge.root_cause(failures(ECHO), waited_s=0.0, grace_s=1.0, ranks_left=0) == 0


def test_the_first_of_several_root_causes_wins_and_no_failure_ends_nothing():
    assert judge.root_cause(failures(OWN, OWN), waited_s=0.0, grace_s=1.0, ranks_left=0) == 0
    assert judge.root_cause([], waited_s=9.0, grace_s=1.0, ranks_left=0) is None


def test_a_lost_host_ends_the_attempt_before_a_death_or_an_echo_reported_earlier():
    reported = [judge.Failure(ECHO, 0), judge.Failure(OWN, 1, died_s=5.0), judge.Failure(OWN, 2, host_lost=True)]
    assert judge.root_cause(reported, waited_s=5.0, grace_s=1.0, ranks_left=2, death_gather_s=0.5) == 2


def test_a_process_death_waits_for_its_hosts_heartbeat_then_ends_the_attempt():
    died = [judge.Failure(OWN, 0, died_s=0.2)]
    assert judge.root_cause(died, waited_s=0.2, grace_s=1.0, ranks_left=3, death_gather_s=0.5) is None
    later = [judge.Failure(OWN, 0, died_s=0.5)]
    assert judge.root_cause(later, waited_s=0.5, grace_s=1.0, ranks_left=3, death_gather_s=0.5) == 0


def test_a_process_death_ends_the_attempt_at_once_when_no_rank_is_left_to_report():
    died = [judge.Failure(OWN, 0, died_s=0.0)]
    assert judge.root_cause(died, waited_s=0.0, grace_s=1.0, ranks_left=0, death_gather_s=0.5) == 0


def test_a_ranks_own_error_is_not_held_like_a_death():
    raised = [judge.Failure(OWN, 0)]
    assert judge.root_cause(raised, waited_s=0.0, grace_s=1.0, ranks_left=3, death_gather_s=0.5) == 0


@pytest.mark.parametrize("answers, settled, expected", [
    (False, False, judge.Blame.HOST),  # the host does not answer: every rank on it is gone
    (False, True, judge.Blame.HOST),
    (True, False, judge.Blame.SUSPECT),  # it answers for now: asked again after the settling time
    (True, True, judge.Blame.WORKER),  # it still answers: only the worker went
])
def test_a_lost_worker_blames_its_host_only_when_the_host_does_not_answer(answers, settled, expected):
    assert judge.blame(node_known=True, host_answers=answers, settled=settled) is expected


def test_a_lost_worker_of_an_unknown_node_blames_the_worker():
    assert judge.blame(node_known=False, host_answers=False, settled=False) is judge.Blame.WORKER


def test_lost_heartbeats_are_gathered_for_a_moment_before_they_are_judged():
    assert not judge.losses_gathered(10.0, 10.1, 0.15)
    assert judge.losses_gathered(10.0, 10.15, 0.15)


def test_the_poll_waits_no_longer_than_the_runs_deadline():
    assert judge.poll_timeout(100.0, None, 0.2) == 0.2
    assert judge.poll_timeout(100.0, 100.05, 0.2) == pytest.approx(0.05)
    assert judge.poll_timeout(100.0, 99.0, 0.2) == 0.0


def verdict(now, **kw):
    base = dict(deadline=None, ranks_left=2, stop_at=None, resize_at=None, resize_kind=None)
    return judge.clock_verdict(now, **{**base, **kw})


def test_the_clock_times_a_run_out_only_past_its_deadline_with_ranks_running():
    assert verdict(10.0, deadline=10.0) is judge.ClockVerdict.TIMED_OUT
    assert verdict(9.9, deadline=10.0) is judge.ClockVerdict.NOTHING
    assert verdict(10.0, deadline=10.0, ranks_left=0) is judge.ClockVerdict.NOTHING


def test_the_timeout_comes_before_a_stop_or_a_resize_due_at_the_same_time():
    assert verdict(10.0, deadline=10.0, stop_at=5.0) is judge.ClockVerdict.TIMED_OUT
    assert verdict(10.0, stop_at=10.0) is judge.ClockVerdict.STOP


def test_a_shrink_without_a_commit_in_time_resizes_and_an_offer_not_taken_lapses():
    assert verdict(10.0, resize_at=10.0, resize_kind=NoticeKind.SHRINK) is judge.ClockVerdict.RESIZE
    assert verdict(10.0, resize_at=10.0, resize_kind=NoticeKind.GROW) is judge.ClockVerdict.OFFER_LAPSED
    assert verdict(9.0, resize_at=10.0, resize_kind=NoticeKind.SHRINK) is judge.ClockVerdict.NOTHING


@pytest.mark.parametrize("kind", [NoticeKind.SHRINK, NoticeKind.GROW])
def test_a_resize_notice_is_made_at_the_next_commit(kind):
    assert judge.respond_to_notice(kind, graceful=True, commits=False) is judge.NoticeResponse.RESIZE_AT_COMMIT


@pytest.mark.parametrize("kind", [NoticeKind.PREEMPT, NoticeKind.REVOKE])
def test_a_graceful_preemption_or_revoke_stops_a_committing_run_at_its_next_commit(kind):
    assert judge.respond_to_notice(kind, graceful=True, commits=True) is judge.NoticeResponse.STOP_AT_COMMIT
    assert judge.respond_to_notice(kind, graceful=True, commits=False) is judge.NoticeResponse.STOP_NOW
    assert judge.respond_to_notice(kind, graceful=False, commits=True) is judge.NoticeResponse.STOP_NOW


def test_a_lease_that_ended_without_notice_stops_the_run_now():
    assert judge.respond_to_notice(NoticeKind.ENDED, graceful=False, commits=True) is judge.NoticeResponse.STOP_NOW


def describe(end) -> str:
    """How a controller matches on an attempt's end."""
    match end:
        case Finished(results):
            return f"finished with {len(results)} results"
        case Failed(fault, _):
            return f"failed: {fault.kind.value}"
        case Resize(notice):
            return f"resize: {notice.kind.value}"
        case Stopped(error) | TimedOut(error):
            return f"stopped: {type(error).__name__}"
    raise AssertionError(end)


def test_an_attempts_end_is_a_frozen_value_the_controller_matches_on():
    fault = Fault(FaultKind.PROCESS_DIED, 1, "h", "SIGKILL")
    ends = [Finished({0: b"x", 1: None}), Failed(fault, WorkerFailed("x", rank=1)),
            Resize(Notice(NoticeKind.SHRINK, to_workers=1)), Stopped(Preempted("p")), TimedOut(RunTimeout("t"))]
    assert [describe(e) for e in ends] == ["finished with 2 results", "failed: process died", "resize: shrink",
                                           "stopped: Preempted", "stopped: RunTimeout"]
    with pytest.raises(AttributeError):
        ends[0].results = {}  # frozen


@pytest.mark.parametrize("error, reason, state", [
    (None, "finished", None),
    (KeyboardInterrupt(), "interrupted", RunState.STOPPED),
    (Preempted("p"), "preempted", RunState.PREEMPTED),
    (LeaseRevoked("r"), "revoked", RunState.STOPPED),
    (RunCancelled("c"), "cancelled", RunState.STOPPED),
    (RunTimeout("t"), "timeout", RunState.FAILED),
    (ValueError("v"), "failed", RunState.FAILED),
])
def test_a_runs_end_reason_and_final_state_follow_from_its_error(error, reason, state):
    assert end_reason(error) == reason
    if error is not None:
        assert terminal_state(error) is state
