"""A long queue stays cheap: most requests are judged with a comparison or two, whatever
state the cluster is in. Counted in calls (the fit function, and requests judged the long
way), not in seconds, so it cannot flake. (benchmarks/policy_decision.py measures the time.)"""
import random

import pytest

from gpusession.broker import board, placement, preemption, scheduler
from gpusession.broker.model import ActiveLease, NodeCapacity, Placement, Priority, Quota, Request
from gpusession.broker.policy import decide


def busy_cluster(n_queued: int, *, borrowing: bool) -> dict:
    rng = random.Random(5)
    nodes = [NodeCapacity(f"n{i}", 8.0) for i in range(4)]
    leases = [ActiveLease(i, f"u{i % 20}", 1, 1.0, Priority.NORMAL, over_quota=i % 5 == 0,
                          granted_at=float(i), node_workers={f"n{i % 4}": 1}) for i in range(31)]
    queue = [Request(1000 + i, f"u{rng.randrange(20)}", rng.choice([1, 2, 4, 8]), 1.0,
                     rng.choice(list(Priority)), rng.choice(list(Placement)), arrival=100.0 + i,
                     max_hold_s=rng.choice([None, 600.0]))
             for i in range(n_queued)]
    return dict(nodes=nodes, leases=leases, queue=queue, quotas={},
                default_quota=Quota(max_gpus=4.0, max_priority=Priority.HIGH),
                used_gpu_hours={}, allow_borrowing=borrowing, now=1000.0)


@pytest.fixture
def fit_calls(monkeypatch):
    """Calls to the fit function, plus requests judged the long way (Run._consider)."""
    calls = [0]

    def counting(function):
        def counted(*args, **kwargs):
            calls[0] += 1
            return function(*args, **kwargs)
        return counted

    for module in (board, preemption, scheduler):
        monkeypatch.setattr(module, "plan", counting(placement.plan))
    monkeypatch.setattr(scheduler.Run, "_consider", counting(scheduler.Run._consider))
    return calls


@pytest.mark.parametrize("borrowing", [False, True])
def test_fit_function_is_not_called_per_queued_request(fit_calls, borrowing):
    decision = decide(**busy_cluster(10_000, borrowing=borrowing))
    assert len(decision.waiting) + len(decision.grants) + len(decision.rejections) == 10_000
    assert fit_calls[0] < 300


def test_fit_calls_do_not_grow_with_the_queue(fit_calls):
    decide(**busy_cluster(1_000, borrowing=True))
    short = fit_calls[0]
    fit_calls[0] = 0
    decide(**busy_cluster(10_000, borrowing=True))
    assert fit_calls[0] <= short + 50


def test_free_gpus_held_for_the_head_do_not_make_each_small_request_try_them(fit_calls):
    # n3 has 1 free GPU and drains at t=2000 for an 8-GPU strict_pack head; 10,000 one-GPU
    # requests behind it would each fit now, and each would delay the head
    nodes = [NodeCapacity(f"n{i}", 8.0) for i in range(4)]
    leases = [ActiveLease(i, f"u{i}", 1, 1.0, Priority.NORMAL, False, granted_at=-100.0,
                          ends_by=2000.0 if i >= 24 else None, node_workers={f"n{i // 8}": 1})
              for i in range(31)]
    head = Request(1, "big", 8, 1.0, Priority.NORMAL, Placement.STRICT_PACK, arrival=0.0)
    small = [Request(2 + i, f"v{i % 20}", 1, 1.0, Priority.NORMAL, Placement.PACK, arrival=1.0 + i)
             for i in range(10_000)]
    decision = decide(nodes=nodes, leases=leases, queue=[head, *small], quotas={},
                      default_quota=Quota(), used_gpu_hours={}, allow_borrowing=False, now=1000.0)
    assert decision.grants == []
    assert decision.waiting[2].reason.endswith("held for a request ahead of this one")
    assert fit_calls[0] < 20


def test_a_queue_of_borrowers_on_a_full_cluster_is_judged_without_trying_each(fit_calls):
    state = busy_cluster(10_000, borrowing=True)
    state["default_quota"] = Quota(max_gpus=0.5, max_priority=Priority.HIGH)  # all borrow
    decision = decide(**state)
    assert decision.grants == []
    assert fit_calls[0] < 300
