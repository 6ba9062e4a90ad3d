"""Invariants under load: many concurrent callers of several users against the real broker on a
real Ray cluster — sampled continuously — and a broker killed in the middle of it."""
from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
import ray

from gpusession.broker import client
from gpusession.errors import Preempted, QuotaExceeded
from gpusession.identity import Identity
from gpusession.run.caller.lease import Lease
from gpusession.run.caller.options import validate_run_options

from ..conftest import CLUSTER_GPUS

EPSILON = 1e-6


class Sampler(threading.Thread):
    """Reads the broker's books every few ms and records every broken invariant. A failed read
    (the broker restarting) is recorded too, and sampling goes on: the test checks that it
    sampled until the end, so a sampler that died early cannot pass for one that saw no fault."""

    def __init__(self, broker, admin: dict, max_gpus: dict[str, float]) -> None:
        super().__init__(daemon=True)
        self.broker, self.admin, self.max_gpus = broker, admin, max_gpus
        self.violations: list[str] = []
        self.failures: list[str] = []
        self.samples = 0
        self.last_sample_at = 0.0
        self.peak = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sample()
            except Exception as exc:  # recorded; asserted by the test
                self.failures.append(repr(exc))
                time.sleep(0.1)

    def check(self, *, stopped_at: float, failures_allowed: bool = False) -> None:
        assert self.samples > 20 and not self.violations, self.violations[:5]
        assert stopped_at - self.last_sample_at < 5.0, "the sampler stopped sampling before the load ended"
        assert failures_allowed or not self.failures, self.failures[:3]
        assert len(self.failures) < self.samples, self.failures[:3]

    def sample(self) -> None:
        active = [l for l in client.call(self.broker.leases, self.admin) if l["state"] in ("granted", "placed")]
        held = sum(l["gpus"] for l in active)
        self.peak = max(self.peak, held)
        if held > CLUSTER_GPUS + EPSILON:
            self.violations.append(f"{held} GPUs leased on a {CLUSTER_GPUS}-GPU cluster: {active}")
        for user, limit in self.max_gpus.items():
            within = sum(l["gpus"] for l in active if l["user"] == user and not l["over_quota"])
            if within > limit + EPSILON:
                self.violations.append(f"{user} holds {within} within quota, max {limit}")
        self.samples += 1
        self.last_sample_at = time.monotonic()
        time.sleep(0.01)


class Holding:
    """How many callers hold a granted lease right now, so a crash can be timed into a held one."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def add(self, delta: int) -> None:
        with self.changed:
            self.count += delta
            self.changed.notify_all()

    def wait_for_one(self, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count > 0, timeout)


def _caller(index: int, users: list[str], outcomes: dict, holding: Holding, hold_s: tuple[float, float],
            stop_at_notice: bool = True) -> None:
    rng = random.Random(index)
    user = users[index % len(users)]
    gpus = rng.choice([1, 1, 2, 2, 3, 4])
    priority = rng.choice(["low", "normal", "normal", "high"])
    time.sleep(rng.uniform(0, 1.5))
    lease = None
    try:
        options = validate_run_options(gpus=gpus, priority=priority, queue_timeout="180s")
        lease = Lease(options, identity=Identity(user))
        lease.acquire()
    except QuotaExceeded as exc:
        outcomes[index] = ("refused", str(exc))
        return
    except Preempted:  # taken back for a higher priority while this busy process was placing it
        outcomes[index] = ("preempted", lease.lease_id)
        return
    except Exception as exc:  # recorded, asserted in the test
        outcomes[index] = ("error", repr(exc))
        return
    acquired_at = time.monotonic()
    holding.add(1)
    try:
        deadline = acquired_at + rng.uniform(*hold_s)
        while time.monotonic() < deadline and not (stop_at_notice and lease.notice()):
            time.sleep(0.02)
    finally:
        holding.add(-1)
    lease.release("finished")
    outcomes[index] = ("ran", lease.lease_id, acquired_at, time.monotonic())


def _run_load(cluster, broker, admin, *, callers: int, kill_broker_at: float | None = None,
              hold_s: tuple[float, float] = (0.05, 0.4)):
    """Run the callers; with kill_broker_at, crash the broker that many seconds into the load, at a
    moment some caller holds a granted lease. Returns (users, outcomes, sampler, elapsed, killed_at)."""
    tag = uuid.uuid4().hex[:6]
    users = [f"load-{tag}-{k}" for k in range(5)]
    limits = {users[0]: 1.0, users[1]: 2.0}
    for user, limit in limits.items():
        client.call(broker.set_quota, user, {"max_gpus": limit}, admin)
    client.call(broker.set_quota, users[2], {"max_priority": "high"}, admin)
    sampler = Sampler(broker, admin, limits)
    sampler.start()
    outcomes: dict[int, tuple] = {}
    holding = Holding()
    threads = [threading.Thread(target=_caller, args=(i, users, outcomes, holding, hold_s)) for i in range(callers)]
    started, killed_at = time.monotonic(), None
    try:
        for t in threads:
            t.start()
        if kill_broker_at is not None:
            time.sleep(kill_broker_at)  # into the load ...
            assert holding.wait_for_one(timeout=120), "no caller was granted a lease to crash the broker under"
            killed_at = time.monotonic()  # ... while a call holds its GPUs
            ray.kill(broker, no_restart=False)  # a crash: Ray restarts it from the same ledger
        for t in threads:
            t.join(300)
    finally:  # on every path (a pytest timeout too): a sampler left running would load the broker for later tests
        sampler.stopped_at = time.monotonic()
        sampler.stopping.set()
        sampler.join(30)
        for user in users:
            client.call(broker.reset_quota, user, admin)
    assert not sampler.is_alive()
    return users, outcomes, sampler, time.monotonic() - started, killed_at


def _assert_books_balance(broker, admin, users: list[str], outcomes: dict) -> None:
    rows = [r for r in client.call(broker.leases, admin, True, 100_000) if r["user"] in users]
    held = {o[1] for o in outcomes.values() if o[0] in ("ran", "preempted")}
    granted = [r for r in rows if r["granted_at"] is not None]
    assert {r["lease_id"] for r in granted} == held  # every lease that was held was granted, nothing else
    for row in granted:  # closed exactly once, with consistent GPU-seconds
        assert row["state"] == "ended" and row["end_reason"] in ("finished", "preempted"), row
        assert row["gpu_seconds"] == pytest.approx(row["gpus"] * (row["released_at"] - row["granted_at"]))
    usage = {u["user"]: u["gpu_seconds"] for u in client.call(broker.usage, admin, 0.0, time.time() + 1, "user")}
    for user in users:
        total = sum(r["gpu_seconds"] for r in granted if r["user"] == user)
        assert usage.get(user, 0.0) == pytest.approx(total, abs=1e-2)


def test_fifty_concurrent_callers_never_exceed_capacity_or_quotas_and_every_lease_closes_once(cluster, broker, admin):
    users, outcomes, sampler, _, _ = _run_load(cluster, broker, admin, callers=50)
    errors = [o for o in outcomes.values() if o[0] == "error"]
    assert not errors, errors
    assert len(outcomes) == 50
    sampler.check(stopped_at=sampler.stopped_at)
    assert sampler.peak > 0
    refused = [o for o in outcomes.values() if o[0] == "refused"]
    assert all("max_priority" in o[1] for o in refused)  # only high priority without the right
    _assert_books_balance(broker, admin, users, outcomes)


def test_a_broker_killed_mid_load_comes_back_and_running_calls_finish(cluster, broker, admin):
    pid_before = client.call(broker.info)["pid"]
    users, outcomes, sampler, _, killed_at = _run_load(cluster, broker, admin, callers=20, kill_broker_at=1.5,
                                                       hold_s=(0.5, 1.5))
    assert client.call(broker.info)["pid"] != pid_before  # it really died and came back
    running = [o for o in outcomes.values() if o[0] == "ran" and o[2] <= killed_at <= o[3]]
    assert running, f"no call held its lease across the crash: {list(outcomes.values())}"  # and each finished
    errors = [o for o in outcomes.values() if o[0] == "error"]
    assert not errors, errors
    assert len(outcomes) == 20
    sampler.check(stopped_at=sampler.stopped_at, failures_allowed=True)  # reads during the restart may fail
    _assert_books_balance(broker, admin, users, outcomes)
