"""check_admission: what is rejected at once (SPEC section 1, admission-error table)."""
import pytest

from gpusession.broker.policy.model import NodeCapacity, Placement, Priority, Quota, Request
from gpusession.broker.policy.policy import check_admission

TWO_NODES = [NodeCapacity("a", 4.0), NodeCapacity("b", 4.0)]


def request(gpus=1, *, gpw=1.0, placement=Placement.PACK, priority=Priority.NORMAL, user="alice"):
    return Request(lease_id=7, user=user, workers=int(gpus / gpw), gpus_per_worker=gpw,
                   priority=priority, placement=placement, arrival=0.0)


def admit(req, *, nodes=TWO_NODES, quota=Quota(), used=0.0, borrowing=False):
    return check_admission(req, nodes=nodes, quota=quota, used_gpu_hours=used,
                           allow_borrowing=borrowing)


@pytest.mark.parametrize(
    "gpus, gpw, placement, nodes, admitted",
    [
        (8, 1.0, Placement.PACK, TWO_NODES, True),
        (9, 1.0, Placement.PACK, TWO_NODES, False),
        (8, 1.0, Placement.SPREAD, TWO_NODES, True),
        (4, 1.0, Placement.STRICT_PACK, TWO_NODES, True),
        (5, 1.0, Placement.STRICT_PACK, TWO_NODES, False),
        (2, 1.0, Placement.STRICT_SPREAD, TWO_NODES, True),
        (3, 1.0, Placement.STRICT_SPREAD, TWO_NODES, False),
        # 3-GPU workers: one per 4-GPU node, although 8 GPUs exist in all
        (6, 3.0, Placement.PACK, TWO_NODES, True),
        (9, 3.0, Placement.PACK, TWO_NODES, False),
        # fractional workers: four quarter-GPU workers share one GPU
        (1, 0.25, Placement.STRICT_PACK, [NodeCapacity("a", 1.0)], True),
        (1.25, 0.25, Placement.STRICT_PACK, [NodeCapacity("a", 1.0)], False),
        # unmanaged GPUs are busy now, not forever: judged on node totals
        (4, 1.0, Placement.STRICT_PACK, [NodeCapacity("a", 4.0, unmanaged=4.0)], True),
        (1, 1.0, Placement.PACK, [], False),
    ],
)
def test_request_the_cluster_could_never_place_is_infeasible(gpus, gpw, placement, nodes, admitted):
    reject = admit(request(gpus, gpw=gpw, placement=placement), nodes=nodes)
    assert (reject is None) == admitted
    if not admitted:
        assert reject.error == "Infeasible" and reject.lease_id == 7


def test_infeasible_message_names_the_numbers_and_the_next_step():
    assert admit(request(9)).message == (
        "Needs 9 GPUs (9 workers x 1 GPU) but the cluster (2 nodes, 8 GPUs) can place at most 8. "
        "Ask for at most 8 GPUs, or add nodes to the cluster."
    )
    strict = admit(request(6, placement=Placement.STRICT_PACK)).message
    assert "on one node (strict_pack) but the largest node has 4 GPUs" in strict
    assert "placement='pack'" in strict


def test_request_above_max_gpus_is_infeasible_without_borrowing():
    reject = admit(request(4), quota=Quota(max_gpus=2))
    assert reject.error == "Infeasible"
    assert reject.message == (
        "Needs 4 GPUs but alice may hold 2 (quota max_gpus=2). "
        "Ask for at most 2, or ask an admin to raise alice's quota."
    )


def test_request_above_max_gpus_may_queue_when_borrowing_is_allowed():
    assert admit(request(4), quota=Quota(max_gpus=2), borrowing=True) is None


def test_borrowing_ceiling_is_the_cluster_size():
    nodes = [NodeCapacity("a", 4.0), NodeCapacity("b", 4.0, unmanaged=2.0)]
    assert admit(request(8), nodes=nodes, quota=Quota(max_gpus=2), borrowing=True) is None
    reject = admit(request(9), nodes=nodes, quota=Quota(max_gpus=2), borrowing=True)
    assert reject.error == "Infeasible"


@pytest.mark.parametrize(
    "priority, max_priority, used, budget, error",
    [
        (Priority.HIGH, Priority.NORMAL, 0.0, None, "QuotaExceeded"),
        (Priority.HIGH, Priority.HIGH, 0.0, None, None),
        (Priority.LOW, Priority.LOW, 0.0, None, None),
        (Priority.NORMAL, Priority.NORMAL, 10.0, 10.0, "QuotaExceeded"),  # exactly spent
        (Priority.NORMAL, Priority.NORMAL, 12.5, 10.0, "QuotaExceeded"),
        (Priority.NORMAL, Priority.NORMAL, 9.9, 10.0, None),
        (Priority.NORMAL, Priority.NORMAL, 1e9, None, None),  # no budget: unlimited
    ],
)
def test_priority_above_quota_or_spent_budget_is_quota_exceeded(
    priority, max_priority, used, budget, error
):
    quota = Quota(gpu_hours=budget, max_priority=max_priority)
    reject = admit(request(1, priority=priority), quota=quota, used=used)
    assert (reject.error if reject else None) == error


def test_quota_exceeded_messages_say_what_to_do():
    high = admit(request(1, priority=Priority.HIGH), quota=Quota())
    assert high.message == (
        "Asks for priority high but alice may use at most normal (quota max_priority=normal). "
        "Use priority='normal', or ask an admin to raise alice's max_priority."
    )
    spent = admit(request(1), quota=Quota(gpu_hours=10), used=12.5)
    assert spent.message.startswith("alice has used 12.5 of 10 GPU-hours in the last 7 days")
    assert "ask an admin to raise alice's budget" in spent.message


def test_infeasible_is_reported_before_quota_problems():
    reject = admit(request(9, priority=Priority.HIGH), quota=Quota(gpu_hours=1), used=5)
    assert reject.error == "Infeasible"
