"""Plain values the broker's policy decides over: no Ray, SQLite or clock in here.

The service (service.py) builds these from the ledger and from Ray's view of the cluster, asks
policy.py for a Decision, and carries it out.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

EPSILON = 1e-9  # GPU counts are floats (fractional workers); compare with this slack


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2

    @classmethod
    def parse(cls, value: "Priority | str | int", *, field_name: str = "priority") -> "Priority":
        if isinstance(value, Priority):
            return value
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        raise ValueError(
            f"{field_name} must be one of 'low', 'normal', 'high'; got {value!r}."
        )

    @property
    def label(self) -> str:
        return self.name.lower()


class Placement(str, enum.Enum):
    PACK = "pack"
    SPREAD = "spread"
    STRICT_PACK = "strict_pack"
    STRICT_SPREAD = "strict_spread"

    @classmethod
    def parse(cls, value: "Placement | str", *, field_name: str = "placement") -> "Placement":
        if isinstance(value, Placement):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            choices = ", ".join(repr(p.value) for p in cls)
            raise ValueError(f"{field_name} must be one of {choices}; got {value!r}.") from None

    @property
    def ray_strategy(self) -> str:
        return self.value.upper()


@dataclass(frozen=True)
class Quota:
    """One user's limits. None means "no limit of this kind"."""

    max_gpus: float | None = None  # GPUs held at once (fractions count); None: whole cluster
    gpu_hours: float | None = None  # budget per rolling 7 days; None: unlimited
    max_priority: Priority = Priority.NORMAL


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    gpus: float  # what Ray reports as the node's total GPU resource
    unmanaged: float = 0.0  # GPUs in use on the node outside gpusession's leases


@dataclass(frozen=True)
class Request:
    """A queued lease request."""

    lease_id: int
    user: str
    workers: int
    gpus_per_worker: float
    priority: Priority
    placement: Placement
    arrival: float  # request time; earlier arrives first among equal priority
    max_hold_s: float | None = None  # declared upper bound of the hold (run timeout); None: unknown
    min_workers: int | None = None  # elastic lower bound; None: not elastic

    @property
    def gpus(self) -> float:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True)
class ActiveLease:
    """A granted lease, placed or not yet placed."""

    lease_id: int
    user: str
    workers: int
    gpus_per_worker: float
    priority: Priority
    over_quota: bool
    granted_at: float
    ends_by: float | None = None  # granted_at + declared bound; None: unknown
    # workers per node once Ray created the placement group; None while not yet placed
    node_workers: Mapping[str, int] | None = None
    preempted_for: int | None = None  # lease id it was told to make room for (under notice)
    min_workers: int | None = None
    # the request's placement: the policy simulates an unplaced grant (node_workers None) with it
    placement: Placement = Placement.PACK
    full_workers: int | None = None  # elastic: the size it asked for (it may grow back to it)
    giving: Mapping[str, int] | None = None  # told to shrink: the workers per node it gives up
    noticed: bool = False  # a notice stands (preempt, revoke, shrink or an offer to grow)

    @property
    def gpus(self) -> float:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True)
class Grant:
    lease_id: int
    over_quota: bool
    node_workers: Mapping[str, int]  # the placement the policy planned (Ray has the last word)


@dataclass(frozen=True)
class Preempt:
    victim_id: int
    for_lease_id: int
    reason: str  # "over quota" | "lower priority"
    # An elastic victim shrinks to this many workers instead of stopping. None: it stops.
    shrink_to_workers: int | None = None
    give_node_workers: Mapping[str, int] | None = None  # the workers per node a shrink gives up


@dataclass(frozen=True)
class Reject:
    lease_id: int
    error: str  # "Infeasible" | "QuotaExceeded" (names in gpusession.errors)
    message: str


class WaitKind(str, enum.Enum):
    CAPACITY = "capacity"
    QUOTA = "quota"
    PREEMPTION = "preemption"  # victims were notified and are releasing


class Waiting(NamedTuple):
    """Immutable like the dataclasses here, but a NamedTuple: decide() hands out one per queued
    request (10,000 within its 10 ms) and a tuple is three times cheaper to build and compare.
    Equal values are shared between requests and calls: never mutate one."""

    position: int  # 1-based, over the whole queue, in scheduling order
    kind: WaitKind
    reason: str  # "waiting for capacity: 3 of 4 GPUs in use"


@dataclass(frozen=True)
class Decision:
    grants: list[Grant] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    rejections: list[Reject] = field(default_factory=list)
    waiting: dict[int, Waiting] = field(default_factory=dict)
