"""A broker notice is parsed once, on the client, into a frozen Notice with the broker's NoticeKind."""
from __future__ import annotations

import dataclasses

import pytest

from gpusession.broker.storage import books
from gpusession.broker.protocol.notice import Notice, NoticeKind
from gpusession.errors import LeaseRevoked, Preempted
from gpusession.run.caller.notices import notice_error


def test_the_broker_and_the_client_use_one_notice_kind():
    assert books.NoticeKind is NoticeKind


def test_a_view_with_a_notice_parses_once_into_a_frozen_value():
    view = {"state": "placed", "notice": {"kind": "shrink", "reason": "preempted (x) for lease 9 of bob",
                                          "deadline": 103.0, "id": "4-shrink-103.0", "reason_code": "preempted",
                                          "to_workers": 2, "to_gpus": 2.0, "by": {"lease_id": 9}}}
    notice = Notice.from_view(view)
    assert notice.kind is NoticeKind.SHRINK and notice.kind.is_resize
    assert (notice.to_workers, notice.deadline, notice.id, notice.by) == (2, 103.0, "4-shrink-103.0", {"lease_id": 9})
    with pytest.raises(dataclasses.FrozenInstanceError):
        notice.kind = NoticeKind.GROW


def test_a_view_without_a_notice_is_the_leases_end_and_an_unknown_kind_is_refused():
    ended = Notice.from_view({"state": "ended", "notice": None, "end_reason": "caller gone"})
    assert ended.kind is NoticeKind.ENDED and ended.reason == "caller gone" and not ended.kind.is_resize
    with pytest.raises(ValueError):
        Notice.parse({"kind": "evict"})


def test_each_kind_maps_to_the_error_the_caller_sees():
    lease = type("L", (), {"lease_id": 7, "gpus": 2.0})()
    assert isinstance(notice_error(lease, Notice(NoticeKind.PREEMPT, reason="preempted")), Preempted)
    revoked = notice_error(lease, Notice(NoticeKind.REVOKE, reason="revoked by admin"))
    assert isinstance(revoked, LeaseRevoked) and "revoked by admin" in str(revoked)
    assert "The broker ended Lease 7" in str(notice_error(lease, Notice(NoticeKind.ENDED, reason="caller gone")))
