"""The ledger and the books, on a real SQLite file, with time passed in."""
from __future__ import annotations

import datetime as dt
import sqlite3
import uuid

import pytest

from gpusession.broker.service import views
from gpusession.broker.storage.books import Books, PolicySettings
from gpusession.broker.storage.ledger import MIGRATIONS, Ledger
from gpusession.broker.policy.model import NodeCapacity, Priority, Quota
from gpusession.broker.service.settings import parse_quota_update

NODES = [NodeCapacity("node-a", 4.0)]
T0 = 1_800_000_000.0


def _fields(user="alice", workers=1, gpus_per_worker=1.0, priority=Priority.NORMAL, **extra):
    return {"request_id": uuid.uuid4().hex, "user": user, "job_id": "01000000",
            "gpus": workers * gpus_per_worker, "workers": workers, "gpus_per_worker": gpus_per_worker,
            "min_workers": None, "priority": int(priority), "placement": "pack", "max_hold_s": None,
            "queue_timeout_s": None, **extra}


@pytest.fixture
def books(tmp_path):
    return Books(Ledger(tmp_path / "ledger.db"), PolicySettings())


def test_a_placed_lease_is_closed_exactly_once_with_its_gpu_seconds(books):
    lease_id, _ = books.add_request(_fields(workers=2), NODES, T0)
    books.schedule(NODES, T0 + 1)
    assert books.rows[lease_id]["state"] == "granted"
    books.place(lease_id, {"node-a": 2}, T0 + 2)
    books.close(lease_id, "finished", T0 + 11)
    books.close(lease_id, "caller gone", T0 + 20)  # a retry or a race: changes nothing
    row = books.ledger.lease(lease_id)
    assert (row["state"], row["end_reason"], row["gpu_seconds"]) == ("ended", "finished", 2 * 10.0)


def test_a_grant_that_ray_never_placed_is_not_billed(books):
    """Its node was lost before Ray placed it, or its caller gave up: 30 s of a grant cost nothing."""
    lease_id, _ = books.add_request(_fields(user="erin", workers=4), NODES, T0)
    books.schedule(NODES, T0 + 1)
    books.close(lease_id, "failed", T0 + 31)
    assert books.ledger.lease(lease_id)["gpu_seconds"] == 0.0
    assert books.ledger.usage_by_user(T0, T0 + 100, "erin") == []


def test_a_retried_request_with_the_same_id_returns_the_first_lease(books):
    fields = _fields()
    first, _ = books.add_request(fields, NODES, T0)
    again, effects = books.add_request(dict(fields), NODES, T0 + 1)
    assert again == first and not effects.changed
    assert len(books.ledger.recent_leases()) == 1


def test_an_infeasible_request_is_recorded_as_rejected_with_its_message(books):
    lease_id, _ = books.add_request(_fields(workers=5), NODES, T0)
    row = books.recent(lease_id)
    assert row["state"] == "ended" and row["end_reason"] == "rejected"
    assert row["notice"]["error"] == "Infeasible" and "5 GPUs" in row["notice"]["message"]
    assert books.ledger.lease(lease_id)["gpu_seconds"] == 0.0


def test_books_survive_a_restart_with_open_leases_and_quotas(tmp_path):
    first = Books(Ledger(tmp_path / "l.db"), PolicySettings())
    lease_id, _ = first.add_request(_fields(), NODES, T0)
    first.schedule(NODES, T0)
    first.ledger.set_quota("bob", Quota(max_gpus=1), by="admin", now=T0)
    reborn = Books(Ledger(tmp_path / "l.db"), PolicySettings())
    assert reborn.rows[lease_id]["state"] == "granted"
    assert reborn.quota_for("bob").max_gpus == 1 and reborn.quota_for("carol") == Quota()


def test_migrations_are_applied_once_and_recorded(tmp_path):
    Ledger(tmp_path / "l.db")
    assert Ledger(tmp_path / "l.db").migrate() == []  # nothing left to apply on a second open
    names = [r[0] for r in sqlite3.connect(tmp_path / "l.db").execute("select name from _migrations")]
    assert names == [name for name, _ in MIGRATIONS]


def test_gpu_hours_of_the_rolling_window_count_running_and_clipped_leases(books):
    old, _ = books.add_request(_fields(user="alice"), NODES, T0)
    books.schedule(NODES, T0)
    books.place(old, {"node-a": 1}, T0)
    books.close(old, "finished", T0 + 3600)  # 1 GPU-hour
    running, _ = books.add_request(_fields(user="alice", workers=2), NODES, T0 + 7200)
    books.schedule(NODES, T0 + 7200)
    books.place(running, {"node-a": 2}, T0 + 7200)
    used = books.ledger.gpu_hours_since(T0 + 1800, T0 + 9000)  # half of the first, 0.5 h x 2 GPUs
    assert used["alice"] == pytest.approx(0.5 + 2 * 1800 / 3600)
    books.close(running, "finished", T0 + 9000)


def test_usage_by_day_splits_a_lease_at_midnight_utc(books):
    midnight = dt.datetime(2027, 3, 1, tzinfo=dt.timezone.utc).timestamp()
    lease_id, _ = books.add_request(_fields(user="dana"), NODES, midnight - 1800)
    books.schedule(NODES, midnight - 1800)
    books.place(lease_id, {"node-a": 1}, midnight - 1800)
    books.close(lease_id, "finished", midnight + 3600)
    rows = views.usage_report(books.ledger.usage_intervals(midnight - 86400, midnight + 86400), by="day")
    assert rows == [{"user": "dana", "day": "2027-02-28", "gpu_seconds": 1800.0},
                    {"user": "dana", "day": "2027-03-01", "gpu_seconds": 3600.0}]


@pytest.mark.parametrize("update, message", [
    ({"max_gpus": -1}, "max_gpus must be a number >= 0 or null"),
    ({"max_gpus": "2"}, "max_gpus must be a number >= 0 or null"),
    ({"gpu_hours": True}, "gpu_hours must be a number >= 0 or null"),
    ({"max_priority": "urgent"}, "max_priority must be one of"),
    ({"max_gpu": 2}, "unknown quota field 'max_gpu'"),
    ([1, 2], "quota must be an object"),
])
def test_bad_quota_updates_name_the_field(update, message):
    with pytest.raises(ValueError, match=message):
        parse_quota_update(update, Quota())


def test_quota_update_keeps_fields_not_given_and_null_means_no_limit():
    base = Quota(max_gpus=2, gpu_hours=10, max_priority=Priority.HIGH)
    assert parse_quota_update({"max_gpus": None}, base) == Quota(None, 10, Priority.HIGH)


def test_ledger_wide_stats_count_outcomes_and_cumulative_queue_waits(books):
    waits = [0.2, 3.0, 40.0]
    for wait in waits:
        lease_id, _ = books.add_request(_fields(), NODES, T0)
        books.rows[lease_id]["requested_at"] = T0 - wait  # waited this long before the grant below
        books.ledger.db.execute("update leases set requested_at = ? where id = ?", [T0 - wait, lease_id])
        books.schedule(NODES, T0)
        books.close(lease_id, "finished", T0 + 1)
    books.add_request(_fields(workers=9), NODES, T0)  # rejected: never granted, no wait counted
    assert books.ledger.outcome_counts() == {"finished": 3, "rejected": 1}
    histogram = books.ledger.queue_wait_histogram((1.0, 10.0, 60.0))
    assert histogram["buckets"] == [[1.0, 1], [10.0, 2], [60.0, 3]]
    assert histogram["count"] == 3 and histogram["sum"] == pytest.approx(sum(waits))
