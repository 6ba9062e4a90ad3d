"""Hypothesis fuzzes every broker method through the real actor, as a stranger to the one lease
that is held (another user's id): every call is answered in bounded time, either with a result or
with a named refusal (tests/fuzzcheck.py: a bare TypeError/ValueError or BrokerFailed is a crash,
and tests/unit/test_refusals_and_incidents.py shows the judge fails on one), and a refused call
changes nothing. Inputs: wrong types, huge sizes, NaN and infinities, unknown fields."""
from __future__ import annotations

import math
import time

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpusession as gs
from gpusession.broker import client
from gpusession.broker.service.service import BrokerService
from gpusession.errors import NotAuthorized

from ..fuzzcheck import judge_broker_error

HUGE = st.sampled_from(["x" * 5000, "\x00" * 300, 10**40, -10**40, float("nan"), float("-inf"), 1e308,
                        list(range(2000)), {str(i): i for i in range(300)}])
JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=20), HUGE),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
STRANGER = {"user": "fuzz-stranger", "job_id": "ffff"}
AUTHS = st.one_of(st.just(STRANGER), JUNK, st.fixed_dictionaries({"user": JUNK, "token": JUNK}))
SPECS = st.one_of(JUNK, st.fixed_dictionaries(
    {"request_id": st.one_of(st.uuids().map(lambda u: u.hex), JUNK), "user": st.just("fuzz-stranger"),
     "workers": st.one_of(st.integers(-3, 6), JUNK), "gpus_per_worker": st.one_of(st.floats(), st.integers(-2, 8))},
    optional={"placement": JUNK, "priority": JUNK, "max_hold_s": JUNK, "sweep_id": JUNK, "min_workers": JUNK,
              "released_at": JUNK, "notebook": JUNK, "cell_id": JUNK, "background": JUNK, "job_id": JUNK}))
NODES = st.one_of(JUNK, st.dictionaries(st.one_of(st.text(max_size=8), st.just("ab" * 20)), JUNK, max_size=3))


def calls(lease_ids):
    ids = st.one_of(st.sampled_from(lease_ids), JUNK)
    auth = st.builds(dict, auth=AUTHS)
    return st.one_of(
        st.tuples(st.just("request"), st.tuples(SPECS), st.just({})),
        st.tuples(st.just("wait"), st.tuples(ids, JUNK, st.one_of(st.floats(0, 0.2), JUNK)), auth),
        st.tuples(st.just("watch"), st.tuples(ids), st.builds(dict, auth=AUTHS, seen=JUNK)),
        st.tuples(st.just("placed"), st.tuples(ids, NODES, JUNK), st.builds(dict, auth=AUTHS, gpu_ids=JUNK)),
        st.tuples(st.just("release"), st.tuples(ids, JUNK), auth),
        st.tuples(st.just("revoke"), st.tuples(ids, AUTHS), st.just({})),
        st.tuples(st.just("status"), st.tuples(AUTHS), st.just({})),
        st.tuples(st.just("leases"), st.tuples(AUTHS, JUNK, JUNK), st.just({})),
        st.tuples(st.just("cluster"), st.just(()), st.just({})),
        st.tuples(st.just("version"), st.just(()), st.just({})),
        st.tuples(st.just("info"), st.tuples(JUNK), st.just({})),
        st.tuples(st.just("quotas"), st.tuples(AUTHS), st.just({})),
        st.tuples(st.just("quota"), st.tuples(JUNK, AUTHS), st.just({})),
        st.tuples(st.just("set_quota"), st.tuples(JUNK, JUNK, AUTHS), st.just({})),
        st.tuples(st.just("reset_quota"), st.tuples(JUNK, AUTHS), st.just({})),
        st.tuples(st.just("usage"), st.tuples(AUTHS, JUNK, JUNK, JUNK), st.just({})),
        st.tuples(st.just("stats"), st.tuples(AUTHS, JUNK), st.just({})),
        st.tuples(st.just("timings"), st.tuples(AUTHS, JUNK), st.just({})),
        st.tuples(st.just("retire"), st.tuples(AUTHS), st.just({})),
        st.tuples(st.just("signing_key"), st.tuples(AUTHS), st.just({})),
        st.tuples(st.just("progress"), st.tuples(ids, JUNK), auth),
        st.tuples(st.just("resize"), st.tuples(ids, JUNK, NODES), st.builds(dict, auth=AUTHS, gpu_ids=JUNK)),
        st.tuples(st.just("relocate"), st.tuples(ids, JUNK), auth),
        st.tuples(st.just("relocated"), st.tuples(ids, NODES), st.builds(dict, auth=AUTHS, gpu_ids=JUNK)),
    )


FUZZED = {"request", "wait", "watch", "placed", "release", "revoke", "status", "leases", "cluster", "version", "info",
          "quotas", "quota", "set_quota", "reset_quota", "usage", "stats", "timings", "retire", "signing_key",
          "progress", "resize", "relocate", "relocated"}
ADMIN_ONLY = ("set_quota", "reset_quota", "stats", "timings", "retire", "signing_key")


def test_every_public_broker_method_is_fuzzed():
    public = {name for name in dir(BrokerService) if not name.startswith("_") and callable(getattr(BrokerService, name))}
    assert public - FUZZED == set(), "add these broker methods to calls() above"


def _state(broker, admin) -> list:
    views = client.call(broker.leases, admin, True, 10_000)
    quotas = client.call(broker.quotas, admin)
    return [sorted((v["lease_id"], v["state"], v["version"], v["end_reason"]) for v in views),
            sorted((q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"]) for q in quotas)]


def test_fuzzed_broker_calls_are_answered_refused_cleanly_or_never_change_anything(cluster, quiet, broker, admin):
    held = gs.lease(gpus=1)
    group_before = ray.util.placement_group_table(held._pg)["state"]

    @settings(max_examples=200, suppress_health_check=list(HealthCheck))
    @given(call=calls([held.lease_id, held.lease_id + 10_000]))
    def fuzz(call):
        name, args, kwargs = call
        before = _state(broker, admin)
        started = time.monotonic()
        try:
            result = client.call(getattr(broker, name), *args, timeout=30, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the judge says whether it was a refusal or a crash
            judge_broker_error(name, args, exc)
            assert time.monotonic() - started < 5.0, f"{name} took {time.monotonic() - started:.1f} s to refuse"
            assert _state(broker, admin) == before, f"{name}{args!r} was refused but changed the books"
            return
        assert name not in ADMIN_ONLY, (name, args)
        if name == "request":  # a valid request from the stranger: give it back
            client.call(broker.release, result["lease_id"], "finished", auth={"user": result["user"],
                                                                              "job_id": args[0].get("job_id")})
        if name in ("wait", "watch", "placed", "release", "revoke", "progress", "resize", "relocate", "relocated") \
                and result is not None:  # only on the stranger's own leases
            assert result["lease_id"] != held.lease_id and result["user"] == "fuzz-stranger", (name, args)

    try:
        fuzz()
        mine = next(v for v in client.call(broker.leases, admin) if v["lease_id"] == held.lease_id)
        assert mine["state"] == "placed" and mine["notice"] is None
        assert ray.util.placement_group_table(held._pg)["state"] == group_before == "CREATED"
        assert held.run(lambda: math.pi) == math.pi
    finally:
        held.release()


def test_timings_gives_an_admin_percentiles_per_kind_reset_starts_over_and_others_are_refused(cluster, quiet, broker,
                                                                                               admin):
    gs.lease(gpus=1).release()  # at least one request and one release measured
    summary = client.call(broker.timings, admin)
    assert {"request", "release", "loop_lag"} <= set(summary), summary
    for kind, numbers in summary.items():
        assert numbers["n"] >= 1 and 0 <= numbers["p50_ms"] <= numbers["p99_ms"] <= numbers["max_ms"], (kind, numbers)
    assert client.call(broker.timings, admin, True).keys() >= {"request", "release"}  # the summary before the reset
    after = client.call(broker.timings, admin)
    assert "request" not in after and "release" not in after, after  # nothing asked since the reset
    with pytest.raises(NotAuthorized, match="admin token"):
        client.call(broker.timings, {"user": "fuzz-stranger"})
