"""The replayed day's world, shared by gpusession's replay (utilization_replay.py) and the
Kueue-like baseline (_kueue_baseline.py): the workload's constants, its users, the virtual clock,
the figures."""
from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, field

from gpusession.broker.policy.model import NodeCapacity, Quota

SEED = 11
USERS = 20
NODES = [NodeCapacity("node0", 4.0), NodeCapacity("node1", 4.0)]
DAY_S = 8 * 3600.0
OPEN_WITHIN_S = 3600.0
THINK_MEAN_S = 20 * 60.0
BURST_MEDIAN_S, BURST_SIGMA = 5 * 60.0, 0.5
SIZES = [1] * 13 + [2] * 5 + [4] * 2
ELASTIC_MIN = 2  # a 4-GPU burst may shrink to 2
QUOTA = Quota(max_gpus=4.0)
FALLBACK_START_S, FALLBACK_RESIZE_S, FALLBACK_BASELINE_START_S = 3.0, 3.0, 4.4


@dataclass
class Costs:
    start_s: float  # gpusession: lease, start the workers, release
    resize_s: float  # gpusession: an elastic resize (no progress while it restarts from its checkpoint)
    baseline_start_s: float  # the queue's job: a new process
    source: str


@dataclass
class User:
    """One user's day, drawn once and replayed identically in both worlds."""

    name: str
    gpus: int
    opens_at: float
    thinks: list[float]
    bursts: list[float]
    asked: int = 0
    ran: int = 0
    waiting: int = 0  # bursts asked and not started when the day ended
    used_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    def next_work(self) -> float:
        """The next burst's work in GPU-seconds at its full size."""
        self.asked += 1
        return self.gpus * self.bursts[self.asked - 1]

    def think(self) -> float:
        return self.thinks[self.asked]


def draw_users(seed: int = SEED) -> list[User]:
    rng = random.Random(seed)
    sizes = rng.sample(SIZES, len(SIZES))
    return [User(f"user{i:02d}", sizes[i], rng.uniform(0, OPEN_WITHIN_S),
                 [rng.expovariate(1 / THINK_MEAN_S) for _ in range(200)],
                 [rng.lognormvariate(0, BURST_SIGMA) * BURST_MEDIAN_S for _ in range(200)])
            for i in range(USERS)]


@dataclass
class World:
    name: str
    users: list[User]
    reserved_s: float = 0.0
    resizes: int = 0
    stopped: int = 0  # preemptions that stopped a burst (it was asked again for its work left)
    last_id: int = 0

    def new_id(self) -> int:
        self.last_id += 1
        return self.last_id

    def used_s(self) -> float:
        return sum(u.used_s for u in self.users)

    def served(self) -> int:
        return sum(1 for u in self.users if u.ran > 0 and u.ran + u.waiting >= u.asked)

    def waits(self) -> list[float]:
        return [w for u in self.users for w in u.waits]


class Clock:
    """The virtual clock's event heap; an end event carries the job's version (stale ones drop)."""

    def __init__(self) -> None:
        self.heap: list = []
        self.seq = 0

    def at(self, when: float, kind: str, payload, version: int = 0) -> None:
        heapq.heappush(self.heap, (when, self.seq, kind, payload, version))
        self.seq += 1

    def due(self) -> list:
        now = self.heap[0][0]
        out = []
        while self.heap and self.heap[0][0] == now:
            out.append(heapq.heappop(self.heap))
        return out


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else 0.0


def figures(world: World) -> dict:
    waits = world.waits()
    return {"used/reserved": world.used_s() / world.reserved_s, "served": world.served(),
            "p95": p95(waits), "median": statistics.median(waits) if waits else 0.0,
            "bursts": sum(u.ran for u in world.users)}
