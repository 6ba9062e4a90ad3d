"""The one request model: every nonsense value a careless notebook can send is refused at once,
naming the field and the allowed range; sensible ones come through unchanged."""
from __future__ import annotations

import math
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusession.broker.policy.model import NodeCapacity, Placement, Priority
from gpusession.broker.protocol.request import (FIELD_NAMES, MIN_GPUS_PER_WORKER, InvalidRequest, LeaseRequest,
                                       node_workers, notebook_label, cell_label, usage_range)
from gpusession.errors import GPUSessionError

NODES = [NodeCapacity("aa01", 4.0), NodeCapacity("bb02", 4.0)]


def spec(**changes) -> dict:
    base = {"request_id": uuid.uuid4().hex, "user": "alice", "job_id": "01000000", "workers": 2,
            "gpus_per_worker": 1.0, "priority": "normal", "placement": "pack"}
    base.update(changes)
    return base


@pytest.mark.parametrize("field,value", [
    ("workers", 0), ("workers", -3), ("workers", 2.5), ("workers", True), ("workers", "2"),
    ("gpus_per_worker", 0), ("gpus_per_worker", -1), ("gpus_per_worker", 1e-320), ("gpus_per_worker", 1e-9),
    ("gpus_per_worker", math.nan), ("gpus_per_worker", math.inf), ("gpus_per_worker", 2**-30),
    ("gpus_per_worker", 1.5), ("max_hold_s", math.nan), ("max_hold_s", -1), ("queue_timeout_s", math.inf),
    ("min_workers", 3), ("min_workers", 0), ("priority", "urgent"), ("placement", "anywhere"),
    ("sweep_id", ""), ("sweep_id", "a/b"), ("sweep_id", "x" * 65), ("request_id", None), ("user", ""),
    ("notebook", ""), ("notebook", "a\nb.ipynb"), ("notebook", "x" * 513), ("notebook", 3),
    ("cell_id", ""), ("cell_id", "a b"), ("cell_id", "x" * 65),
    ("background", 1), ("background", "yes"), ("background", None),
])
def test_a_nonsense_value_is_refused_naming_its_field_within_milliseconds(field, value):
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as refused:
        LeaseRequest.parse(spec(**{field: value}))
    assert time.perf_counter() - started < 0.05
    assert field in str(refused.value) and "Nothing was changed" in str(refused.value)
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, GPUSessionError)


def test_more_gpus_per_worker_than_any_node_has_is_refused_with_the_largest_node():
    request = LeaseRequest.parse(spec(gpus_per_worker=5))
    with pytest.raises(InvalidRequest, match=r"gpus_per_worker must be from 0.01 to 4 .*got 5"):
        request.check_fits(NODES)


def test_an_unknown_field_is_refused_and_sweep_id_is_a_known_one():
    with pytest.raises(InvalidRequest, match="Unknown request field 'gpus_per_wroker'"):
        LeaseRequest.parse(spec(gpus_per_wroker=1))
    assert "sweep_id" in FIELD_NAMES
    assert LeaseRequest.parse(spec(sweep_id="lr-sweep_3.a")).sweep_id == "lr-sweep_3.a"
    assert LeaseRequest.parse(spec()).sweep_id is None


def test_a_request_names_its_notebook_and_a_strange_session_name_is_no_label():
    assert LeaseRequest.parse(spec(notebook="work/train ü.ipynb")).notebook == "work/train ü.ipynb"
    assert LeaseRequest.parse(spec()).notebook is None
    assert notebook_label("work/train.ipynb") == "work/train.ipynb"
    assert [notebook_label(v) for v in (None, "", "a\tb", "x" * 513, 7)] == [None] * 5
    assert LeaseRequest.parse(spec(cell_id="8f0c-4b_a")).cell_id == "8f0c-4b_a"
    assert [cell_label(v) for v in ("8f0c-4b", None, "a b", 3)] == ["8f0c-4b", None, None, None]


def test_a_request_says_whether_a_background_run_asked_and_is_not_one_by_default():
    assert LeaseRequest.parse(spec()).background is False
    assert LeaseRequest.parse(spec(background=True)).to_dict()["background"] is True


def test_a_valid_request_round_trips_through_its_wire_form():
    request = LeaseRequest.parse(spec(workers=4, gpus_per_worker=0.5, min_workers=2, priority="high",
                                      placement="spread", max_hold_s=60, sweep_id="s1"))
    assert LeaseRequest.parse(request.to_dict()) == request
    assert (request.gpus, request.priority, request.placement) == (2.0, Priority.HIGH, Placement.SPREAD)


@pytest.mark.parametrize("value", [{"aa01": -3}, {"aa01": 1}, {"aa01": 2.0}, {"aa01": 1, "bb02": 2}, [], None,
                                   {"not-hex!": 2}])
def test_placed_worker_counts_must_add_up_to_the_grant(value):
    with pytest.raises(InvalidRequest, match="node_workers"):
        node_workers(value, workers=2)
    assert node_workers({"aa01": 1, "bb02": 1}, workers=2) == {"aa01": 1, "bb02": 1}


def test_a_usage_range_is_bounded_by_the_ledger_and_now():
    now = 2_000_000_000.0
    assert usage_range(0.0, 253402300799.0, now=now, earliest=now - 86400) == (now - 86400, now)
    assert usage_range(None, None, now=now, earliest=None) == (now, now)  # an empty ledger: nothing to count
    with pytest.raises(InvalidRequest, match="swap them"):
        usage_range(10.0, 5.0, now=now, earliest=0.0)
    with pytest.raises(InvalidRequest, match="since"):
        usage_range(math.nan, None, now=now, earliest=0.0)


ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                st.text(max_size=70), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                                          st.integers(), max_size=2))
FIELDS = st.sampled_from(FIELD_NAMES + ("released_at", "gpus"))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(FIELDS, ANY, max_size=4))
def test_any_request_either_parses_into_sane_values_or_is_refused_as_invalid(changes):
    try:
        request = LeaseRequest.parse(spec(**changes))
    except InvalidRequest as exc:
        assert str(exc)
        return
    assert isinstance(request.workers, int) and 1 <= request.workers
    assert math.isfinite(request.gpus_per_worker) and request.gpus_per_worker >= MIN_GPUS_PER_WORKER
    assert request.min_workers is None or 1 <= request.min_workers <= request.workers
    for value in (request.max_hold_s, request.queue_timeout_s):
        assert value is None or (math.isfinite(value) and value > 0)
    assert LeaseRequest.parse(request.to_dict()) == request


def test_half_gpu_workers_of_two_leases_may_share_a_gpu_but_not_overfill_it():
    from gpusession.broker.policy import gpuids

    node = "ab" * 28
    half = gpuids.Holder(1, 0.5, {node: [["0"]]})
    ids = gpuids.parse({node: [["0"]]}, node_workers={node: 1}, gpus_per_worker=0.5)
    gpuids.check_room(2, ids, gpus_per_worker=0.5, node_gpus={node: 4.0}, others=[half])  # 0.5 + 0.5: fits
    with pytest.raises(InvalidRequest, match="lease 1 holds it"):
        gpuids.check_room(2, {node: [["0"]]}, gpus_per_worker=1.0, node_gpus={node: 4.0}, others=[half])
    with pytest.raises(InvalidRequest, match=r"gpu_ids\[abababababab...\] must be 2 distinct GPU ids"):
        gpuids.parse({node: [["0", "0"]]}, node_workers={node: 1}, gpus_per_worker=2.0)
