"""Who may act on a lease (pure), and the journal that keeps SQLite off the broker's loop."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid

import pytest

from gpusession.broker.service.authz import Caller, Keys, caller, check_owner
from gpusession.broker.storage.books import Books, PolicySettings
from gpusession.broker.storage.journal import Journal
from gpusession.broker.storage.ledger import Ledger
from gpusession.broker.policy.model import NodeCapacity
from gpusession.errors import InvalidRequest, NotAuthorized
from gpusession.identity import sign

KEYS = Keys(admin_token="t0ken", identity_key=b"k3y", require_signed=False)
ROW = {"id": 17, "user": "alice", "job_id": "01000000"}


def test_only_the_owner_from_the_job_that_asked_or_an_admin_may_act_on_a_lease():
    check_owner(ROW, Caller("alice", "01000000", False), "release")
    check_owner(ROW, Caller("admin", None, True), "release")
    with pytest.raises(NotAuthorized, match="Lease 17 belongs to alice; only its owner or an admin may release"):
        check_owner(ROW, Caller("bob", "01000000", False), "release")
    with pytest.raises(NotAuthorized, match=r"belongs to the kernel \(Ray job 01000000\).*this is job 02000000"):
        check_owner(ROW, Caller("alice", "02000000", False), "wait on")


def test_the_caller_is_what_its_credentials_prove():
    assert caller({"token": "t0ken", "user": "ada"}, KEYS) == Caller("ada", None, True)
    assert caller({"token": "guess", "user": "ada"}, KEYS) == Caller("ada", None, False)
    assert caller({"user": "bob", "job_id": "02"}, KEYS) == Caller("bob", "02", False)
    for bad in (None, "alice", {}, {"user": ""}):
        with pytest.raises(NotAuthorized):
            caller(bad, KEYS)
    with pytest.raises(InvalidRequest, match="Unknown auth field 'released_at'"):
        caller({"user": "bob", "released_at": 0}, KEYS)


def test_a_signed_identity_is_required_when_the_broker_says_so():
    strict = Keys("t0ken", b"k3y", True)
    assert caller({"user": "alice", "signature": sign("alice", b"k3y")}, strict).user == "alice"
    with pytest.raises(NotAuthorized, match="not signed by the Jupyter server"):
        caller({"user": "mallory", "signature": sign("alice", b"k3y")}, strict)


def test_a_signature_expires_says_when_and_what_to_do_but_still_lets_its_leases_end():
    strict = Keys("t0ken", b"k3y", True)
    old = sign("alice", b"k3y", valid_for_s=3600, now=time.time() - 7200)  # expired an hour ago
    with pytest.raises(NotAuthorized, match=r"expired at .* UTC.*Restart your server"):
        caller({"user": "alice", "signature": old}, strict)
    # a lease granted while it was valid may go on and be released
    assert caller({"user": "alice", "signature": old}, strict, expired_ok=True).user == "alice"
    forged = old.rsplit(".", 1)[0] + "." + "0" * 64
    with pytest.raises(NotAuthorized, match="not signed by the Jupyter server"):
        caller({"user": "alice", "signature": forged}, strict, expired_ok=True)
    stretched = f"v2.{int(time.time()) + 3600}.{old.rsplit('.', 1)[1]}"  # its expiry moved: the HMAC no longer fits
    with pytest.raises(NotAuthorized, match="not signed by the Jupyter server"):
        caller({"user": "alice", "signature": stretched}, strict)
    plain_hmac = hmac.new(b"k3y", b"alice", hashlib.sha256).hexdigest()  # the old form, without an expiry
    with pytest.raises(NotAuthorized, match="not signed by the Jupyter server"):
        caller({"user": "alice", "signature": plain_hmac}, strict)


def _fields(user="alice"):
    return {"request_id": uuid.uuid4().hex, "user": user, "job_id": "01", "gpus": 1.0, "workers": 1,
            "gpus_per_worker": 1.0, "min_workers": None, "priority": 1, "placement": "pack", "max_hold_s": None,
            "queue_timeout_s": None}


def test_the_journal_commits_changes_in_order_off_the_loop_and_reads_see_them(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    journal = Journal(ledger)
    books = Books(ledger, PolicySettings(), journal=journal)
    nodes = [NodeCapacity("aa01", 4.0)]

    async def scenario():
        lease_id, _ = books.add_request(_fields(), nodes, 1000.0)
        books.schedule(nodes, 1001.0)
        books.place(lease_id, {"aa01": 1}, 1001.5)
        books.close(lease_id, "finished", 1011.0)
        row = await journal.read("lease", lease_id)  # waits for the four writes before it
        return lease_id, row

    lease_id, row = asyncio.run(scenario())
    assert (row["state"], row["granted_at"], row["released_at"], row["gpu_seconds"]) == ("ended", 1001.0, 1011.0, 10.0)
    assert Books(Ledger(tmp_path / "l.db"), PolicySettings()).rows == {}  # on disk: a restart sees it ended
    journal.shutdown()


def test_a_slow_read_does_not_hold_up_the_loop(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    year = 365 * 86400.0
    with ledger.db.conn:  # 300 leases of a year each: a by-day report cuts ~110,000 pieces
        ledger.db.conn.executemany(
            "insert into leases (request_id, user, gpus, workers, gpus_per_worker, priority, placement, state, "
            "requested_at, granted_at, placed_at, released_at, gpu_seconds) "
            "values (?, 'u', 1, 1, 1, 1, 'pack', 'ended', ?, ?, ?, ?, ?)",
            [(uuid.uuid4().hex, i * 3600.0, i * 3600.0, i * 3600.0, i * 3600.0 + year, year) for i in range(300)])
    journal = Journal(ledger)

    async def scenario():
        ticks = 0
        slow = asyncio.ensure_future(journal.read("usage_by_day", 0.0, 2 * year))
        started = time.perf_counter()
        while not slow.done():
            await asyncio.sleep(0)
            ticks += 1
        return ticks, time.perf_counter() - started

    ticks, seconds = asyncio.run(scenario())
    # the loop kept turning while the read ran on its thread (a read on the loop itself would let it
    # turn once); no lower bound on the read's time: a fast machine reads it quickly
    assert ticks > 10, f"the loop turned {ticks} times during a {seconds * 1000:.1f} ms read"
    journal.shutdown()


def test_a_write_that_fails_inside_a_group_commit_undoes_only_itself(tmp_path):
    import math
    import sqlite3

    ledger = Ledger(tmp_path / "l.db")
    for lease_id in (1, 2):
        ledger.add_lease({"id": lease_id, **_fields(), "state": "queued", "requested_at": 1000.0})
    ledger.grant([(1, False), (2, False)], 1001.0)
    journal = Journal(ledger)
    journal._queue.put(None)  # hold the writer back so the three writes below queue up together
    journal._writer.join()
    first = journal.close(1, "finished", 1011.0, 10.0)
    bad = journal.close(2, "finished", math.nan, 0.0)  # the schema refuses a NaN release time
    third = journal.set_notice(2, {"kind": "revoke"}, None)
    journal._write(_drain(journal))  # what the writer does with what queued up: one group commit
    assert first.result() is True and third.exception() is None
    assert isinstance(bad.exception(), sqlite3.DatabaseError)
    fresh = Ledger(tmp_path / "l.db")
    assert fresh.lease(1)["state"] == "ended" and fresh.lease(2)["state"] == "granted"
    assert fresh.lease(2)["notice"] == {"kind": "revoke"}


def _drain(journal) -> list:
    import queue

    items = []
    while True:
        try:
            items.append(journal._queue.get_nowait())
        except queue.Empty:
            return items
