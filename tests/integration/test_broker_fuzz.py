"""Hypothesis fuzzes the broker's methods through the real actor, as a stranger to the one lease
that is held: every call is answered in bounded time, either with a result or with an error a
caller can act on (never the broker's own failure), and a refused call changes nothing."""
from __future__ import annotations

import math
import time

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpusession as gs
from gpusession.broker import client
from gpusession.errors import BrokerFailed, GPUSessionError

JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
STRANGER = {"user": "fuzz-stranger", "job_id": "ffff"}
AUTHS = st.one_of(st.just(STRANGER), JUNK, st.fixed_dictionaries({"user": JUNK, "token": JUNK}))
SPECS = st.one_of(JUNK, st.fixed_dictionaries(
    {"request_id": st.one_of(st.uuids().map(lambda u: u.hex), JUNK), "user": st.just("fuzz-stranger"),
     "workers": st.one_of(st.integers(-3, 6), JUNK), "gpus_per_worker": st.one_of(st.floats(), st.integers(-2, 8))},
    optional={"placement": JUNK, "priority": JUNK, "max_hold_s": JUNK, "sweep_id": JUNK, "min_workers": JUNK,
              "released_at": JUNK}))


def calls(lease_ids):
    ids = st.one_of(st.sampled_from(lease_ids), JUNK)
    return st.one_of(
        st.tuples(st.just("request"), st.tuples(SPECS), st.just({})),
        st.tuples(st.just("wait"), st.tuples(ids, JUNK, st.one_of(st.floats(0, 0.2), JUNK)), st.builds(dict, auth=AUTHS)),
        st.tuples(st.just("placed"), st.tuples(ids, JUNK), st.builds(dict, auth=AUTHS)),
        st.tuples(st.just("release"), st.tuples(ids, JUNK), st.builds(dict, auth=AUTHS)),
        st.tuples(st.just("revoke"), st.tuples(ids, AUTHS), st.just({})),
        st.tuples(st.just("leases"), st.tuples(AUTHS, JUNK, JUNK), st.just({})),
        st.tuples(st.just("quota"), st.tuples(JUNK, AUTHS), st.just({})),
        st.tuples(st.just("set_quota"), st.tuples(JUNK, JUNK, AUTHS), st.just({})),
        st.tuples(st.just("usage"), st.tuples(AUTHS, JUNK, JUNK, JUNK), st.just({})),
        st.tuples(st.just("stats"), st.tuples(AUTHS, JUNK), st.just({})),
        st.tuples(st.just("info"), st.tuples(JUNK), st.just({})),
        st.tuples(st.just("retire"), st.tuples(AUTHS), st.just({})),
        st.tuples(st.just("signing_key"), st.tuples(AUTHS), st.just({})),
    )


def _state(broker, admin) -> list:
    views = client.call(broker.leases, admin, True, 10_000)
    quotas = client.call(broker.quotas, admin)
    return [sorted((v["lease_id"], v["state"], v["version"], v["end_reason"]) for v in views),
            sorted((q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"]) for q in quotas)]


def test_fuzzed_broker_calls_are_answered_refused_cleanly_or_never_change_anything(cluster, quiet, broker, admin):
    held = gs.lease(gpus=1)
    group_before = ray.util.placement_group_table(held._pg)["state"]

    @settings(max_examples=120, suppress_health_check=list(HealthCheck))
    @given(call=calls([held.lease_id, held.lease_id + 10_000]))
    def fuzz(call):
        name, args, kwargs = call
        before = _state(broker, admin)
        started = time.monotonic()
        try:
            result = client.call(getattr(broker, name), *args, timeout=30, **kwargs)
        except BrokerFailed as exc:
            pytest.fail(f"{name}{args!r} made the broker fail: {exc}")
        except (GPUSessionError, ValueError, TypeError) as exc:
            assert str(exc), name
            assert time.monotonic() - started < 5.0, name
            assert _state(broker, admin) == before, f"{name}{args!r} was refused but changed the books"
            return
        assert name not in ("set_quota", "stats", "retire", "signing_key"), (name, args)  # admins only
        if name == "request":  # a valid request from the stranger: give it back
            client.call(broker.release, result["lease_id"], "finished", auth={"user": result["user"],
                                                                              "job_id": args[0].get("job_id")})
        if name in ("wait", "placed", "release", "revoke"):  # only on the stranger's own leases
            assert result["lease_id"] != held.lease_id and result["user"] == "fuzz-stranger", (name, args)

    try:
        fuzz()
        mine = next(v for v in client.call(broker.leases, admin) if v["lease_id"] == held.lease_id)
        assert mine["state"] == "placed" and mine["notice"] is None
        assert ray.util.placement_group_table(held._pg)["state"] == group_before == "CREATED"
        assert held.run(lambda: math.pi) == math.pi
    finally:
        held.release()
