"""The ledger refuses impossible numbers itself, migrates atomically, survives a bad row at
restart, keeps lease states to the allowed transitions, and reports usage in SQL exactly as the
interval arithmetic says."""
from __future__ import annotations

import logging
import math
import sqlite3
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusession.broker.storage import ledger as ledger_module
from gpusession.broker.service import views
from gpusession.broker.storage.books import Books, PolicySettings
from gpusession.broker.storage.ledger import Ledger
from gpusession.broker.policy.model import NodeCapacity
from gpusession.broker.policy.states import TRANSITIONS, IllegalTransition, LeaseState, check_move, sources

NODES = [NodeCapacity("aa01", 4.0)]
T0 = 1_800_000_000.0


def _row(**extra) -> dict:
    row = {"request_id": uuid.uuid4().hex, "user": "alice", "job_id": "01", "gpus": 1.0, "workers": 1,
           "gpus_per_worker": 1.0, "priority": 1, "placement": "pack", "state": "queued", "requested_at": T0}
    row.update(extra)
    return row


@pytest.mark.parametrize("column,value", [("gpus_per_worker", 1e-320), ("gpus_per_worker", math.nan),
                                          ("gpus", math.inf), ("max_hold_s", -math.inf), ("workers", 0),
                                          ("requested_at", math.inf)])
def test_the_schema_refuses_a_row_with_an_impossible_number(tmp_path, column, value):
    ledger = Ledger(tmp_path / "l.db")
    with pytest.raises(sqlite3.DatabaseError):
        ledger.add_lease(_row(**{column: value}))
    assert ledger.recent_leases() == []


def test_the_schema_refuses_a_release_time_of_nan_or_before_the_grant(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    lease_id = ledger.add_lease(_row())
    ledger.grant([(lease_id, False)], T0 + 5)
    for released in (math.nan, 0.0):
        with pytest.raises(sqlite3.DatabaseError, match="lease row refused"):
            ledger.close(lease_id, "finished", released, 1.0)
    assert ledger.lease(lease_id)["state"] == "granted"


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path, monkeypatch):
    Ledger(tmp_path / "l.db")

    def m999_half_done(db):
        db.execute("create table half (x)")
        raise RuntimeError("disk full")

    monkeypatch.setattr(ledger_module, "MIGRATIONS", ledger_module.MIGRATIONS + [("m999_half_done", m999_half_done)])
    with pytest.raises(RuntimeError, match="disk full"):
        Ledger(tmp_path / "l.db")
    conn = sqlite3.connect(tmp_path / "l.db")
    assert conn.execute("select count(*) from sqlite_master where name = 'half'").fetchone()[0] == 0
    assert "m999_half_done" not in {r[0] for r in conn.execute("select name from _migrations")}


def test_a_restart_quarantines_a_bad_row_with_a_log_line_naming_the_lease(tmp_path, caplog):
    ledger = Ledger(tmp_path / "l.db")
    good = ledger.add_lease(_row())
    ledger.db.execute("drop trigger leases_numbers_insert")  # a row written by an older broker
    bad = ledger.add_lease(_row(user="bob", gpus_per_worker=1e-320, gpus=1e-320))
    with caplog.at_level(logging.ERROR, logger="gpusession.broker"):
        books = Books(Ledger(tmp_path / "l.db"), PolicySettings())
    assert set(books.rows) == {good}
    assert f"Quarantined lease {bad} of bob" in caplog.text and "gpus_per_worker" in caplog.text
    assert [q["id"] for q in books.ledger.quarantined()] == [bad]
    assert books.next_id > bad  # its id is never given again
    lease_id, _ = books.add_request({k: v for k, v in _row().items() if k not in ("state", "requested_at")},
                                    NODES, T0 + 1)
    assert lease_id == bad + 1


def test_lease_states_move_only_along_the_allowed_transitions():
    assert sources(LeaseState.ENDED) == ("queued", "granted", "placed")
    assert sources(LeaseState.PLACED) == ("granted",)
    assert all(not TRANSITIONS[s] for s in LeaseState if s.is_terminal)
    check_move(1, "granted", LeaseState.PLACED)
    with pytest.raises(IllegalTransition, match="Lease 7 cannot go from ended to granted"):
        check_move(7, "ended", LeaseState.GRANTED)
    with pytest.raises(IllegalTransition):
        check_move(7, "queued", LeaseState.PLACED)


def test_an_ended_lease_is_never_granted_or_placed_again_in_the_ledger(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    lease_id = ledger.add_lease(_row())
    ledger.grant([(lease_id, False)], T0 + 1)
    assert ledger.close(lease_id, "finished", T0 + 11, 10.0)
    ledger.grant([(lease_id, False)], T0 + 20)
    ledger.place(lease_id, {"aa01": 1}, T0 + 21)
    assert not ledger.close(lease_id, "lost", T0 + 30, 99.0)
    row = ledger.lease(lease_id)
    assert (row["state"], row["granted_at"], row["released_at"], row["gpu_seconds"]) == ("ended", T0 + 1, T0 + 11, 10.0)


INTERVALS = st.lists(st.tuples(st.sampled_from(["alice", "bob"]), st.sampled_from([0.5, 1.0, 2.0]),
                               st.floats(0, 20 * 86400), st.floats(1, 5 * 86400), st.booleans()),
                     min_size=1, max_size=12)


@settings(max_examples=40)
@given(intervals=INTERVALS, window=st.tuples(st.floats(0, 25 * 86400), st.floats(0, 25 * 86400)))
def test_usage_by_day_in_sql_equals_splitting_each_interval_at_midnight(tmp_path_factory, intervals, window):
    ledger = Ledger(tmp_path_factory.mktemp("usage") / "l.db")
    now = T0 + 30 * 86400
    expected = []
    for user, gpus, start, length, still_open in intervals:
        lease_id = ledger.add_lease(_row(user=user, gpus=gpus, gpus_per_worker=gpus))
        ledger.grant([(lease_id, False)], T0 + start)
        ledger.place(lease_id, {"aa01": 1}, T0 + start)
        end = now if still_open else T0 + start + length
        if not still_open:
            ledger.close(lease_id, "finished", end, gpus * length)
        expected.append((user, gpus, T0 + start, end))
    since, until = T0 + min(window), T0 + max(window)
    clipped = [(u, g, max(s, since), min(e, until)) for u, g, s, e in expected]
    want = views.usage_report(clipped, by="day")
    got = ledger.usage_by_day(since, until)
    got_by_key = {(r["user"], r["day"]): r["gpu_seconds"] for r in got}
    want_by_key = {(r["user"], r["day"]): r["gpu_seconds"] for r in want}
    assert set(got_by_key) <= set(want_by_key)
    for key, seconds in want_by_key.items():
        assert got_by_key.get(key, 0.0) == pytest.approx(seconds, abs=0.01)
    by_user = {r["user"]: r["gpu_seconds"] for r in ledger.usage_by_user(since, until)}
    for r in views.usage_report(clipped, by="user"):
        assert by_user.get(r["user"], 0.0) == pytest.approx(r["gpu_seconds"], abs=0.01)


def test_a_sweep_id_is_stored_with_the_lease_and_shown_in_its_view(tmp_path):
    books = Books(Ledger(tmp_path / "l.db"), PolicySettings())
    fields = {k: v for k, v in _row(sweep_id="lr-sweep.7").items() if k not in ("state", "requested_at")}
    lease_id, _ = books.add_request(fields, NODES, T0)
    assert books.ledger.lease(lease_id)["sweep_id"] == "lr-sweep.7"
    row = Books(Ledger(tmp_path / "l.db"), PolicySettings()).rows[lease_id]  # after a restart too
    assert views.lease_view(row, waiting=None, version=0, now=T0)["sweep_id"] == "lr-sweep.7"
