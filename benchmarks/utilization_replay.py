"""Replay a day of interactive notebook work through the real policy, against pinned GPUs.

Nothing runs on Ray: a virtual clock drives `gpusession.broker.policy.decide`, the same
function the broker calls, and the same users are replayed against the usual alternative,
one GPU pinned to every open notebook.

The workload (seeded, SEED below; every figure here is a module constant):
- a cluster of 8 GPUs: 2 nodes x 4 GPUs;
- 20 users; each opens a notebook at a uniform time in the first hour and leaves it open for
  the rest of the 8-hour day;
- each user alternates think time (reading, plotting: exponential, mean 20 min) with a
  training burst (lognormal duration, median 5 min, sigma 0.5, so mean 5.7 min);
- a user's bursts always need the same number of GPUs (their model and code fix the world
  size): 1 GPU for 13 users, 2 GPUs for 5 users, 4 GPUs for 2 users (65/25/10%), shuffled;
- with gpusession a burst is a lease: request, queue (priority normal, placement pack, no
  declared run time), grant by decide(), 3 s to start the workers, the burst, 1 s to release;
  the user's next think time starts when the burst ends;
- pinned: a notebook takes one GPU when it opens and keeps it all day; a user who finds no free
  GPU tries again at each burst. A burst needing more GPUs than the one pinned (2 or 4) cannot
  run there (data-parallel over N GPUs, or a model sharded over them): it is counted as not
  served, not capped to one GPU; the user moves on to their next think time.

Figures for both: GPU-hours reserved (held by someone), GPU-hours used (busy with a burst),
users served (every burst they asked for ran at its size; bursts still waiting when the day
ends do not count against them), median and p95 queue wait (ask to start, over the bursts
that ran), and Jain's fairness index of GPU-hours used across the 20 users (1 = equal, 1/20 =
one user got all; users needing 4 GPUs rightly use more, so it stays below 1 even when every
burst ran), and Jain's index of the share of each user's bursts that ran.

    .venv/bin/python benchmarks/utilization_replay.py            # the table, seed 11
    .venv/bin/python benchmarks/utilization_replay.py --sweep 20  # seeds 1..20 first, one line each
"""
from __future__ import annotations

import heapq
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusession.broker.model import (  # noqa: E402
    ActiveLease,
    NodeCapacity,
    Placement,
    Priority,
    Quota,
    Request,
)
from gpusession.broker.policy import decide  # noqa: E402

SEED = 11
USERS = 20
NODES = [NodeCapacity("node0", 4.0), NodeCapacity("node1", 4.0)]
DAY_S = 8 * 3600.0
OPEN_WITHIN_S = 3600.0
THINK_MEAN_S = 20 * 60.0
BURST_MEDIAN_S, BURST_SIGMA = 5 * 60.0, 0.5
SIZES = [1] * 13 + [2] * 5 + [4] * 2  # GPUs each user's bursts need (USERS entries)
SETUP_S, RELEASE_S = 3.0, 1.0  # start the workers; release the placement group
QUOTA = Quota(max_gpus=4.0)


@dataclass
class User:
    """One user's day, drawn once and replayed identically in both worlds."""

    name: str
    gpus: int
    opens_at: float
    thinks: list[float]
    bursts: list[float]
    asked: int = 0  # bursts asked so far
    ran: int = 0  # bursts that ran at their size
    refused: int = 0  # bursts that could not run (pinned only)
    used_s: float = 0.0  # GPU-seconds busy
    waits: list[float] = field(default_factory=list)

    def next_burst(self) -> float:
        self.asked += 1
        return self.bursts[self.asked - 1]

    def think(self) -> float:
        return self.thinks[self.asked]


def draw_users(seed: int = SEED) -> list[User]:
    rng = random.Random(seed)
    sizes = rng.sample(SIZES, len(SIZES))
    users = []
    for i in range(USERS):
        n = 200  # far more bursts than a day holds
        users.append(User(
            name=f"user{i:02d}",
            gpus=sizes[i],
            opens_at=rng.uniform(0, OPEN_WITHIN_S),
            thinks=[rng.expovariate(1 / THINK_MEAN_S) for _ in range(n)],
            bursts=[rng.lognormvariate(0, BURST_SIGMA) * BURST_MEDIAN_S for _ in range(n)],
        ))
    return users


@dataclass
class World:
    """What one way of sharing the GPUs did over the day."""

    name: str
    users: list[User]
    reserved_s: float = 0.0  # GPU-seconds held

    @property
    def used_s(self) -> float:
        return sum(u.used_s for u in self.users)

    def served(self) -> int:
        return sum(1 for u in self.users if u.refused == 0 and u.ran > 0)

    def waits(self) -> list[float]:
        return [w for u in self.users for w in u.waits]

    def fairness(self) -> float:
        return jain([u.used_s for u in self.users])

    def demand_fairness(self) -> float:
        return jain([u.ran / max(u.ran + u.refused, 1) for u in self.users])


def jain(values: list[float]) -> float:
    squares = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 0.0


def _clip(start: float, end: float) -> float:
    return max(0.0, min(end, DAY_S) - start)


def replay_gpusession(users: list[User]) -> World:
    """Every burst is a lease decided by policy.decide on a virtual clock."""
    world = World("gpusession", users)
    events = [(u.opens_at + u.think(), i, "ask", u) for i, u in enumerate(users)]
    heapq.heapify(events)
    seq = len(events)
    queue: dict[int, tuple[Request, User]] = {}
    leases: dict[int, ActiveLease] = {}
    next_id = 1
    while events and events[0][0] < DAY_S:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "ask":
                request = Request(next_id, payload.name, payload.gpus, 1.0, Priority.NORMAL,
                                  Placement.PACK, arrival=now)
                queue[next_id] = (request, payload)
                next_id += 1
            else:
                leases.pop(payload)
        decision = decide(nodes=NODES, leases=list(leases.values()),
                          queue=[r for r, _ in queue.values()], quotas={}, default_quota=QUOTA,
                          used_gpu_hours={}, allow_borrowing=False, now=now)
        for grant in decision.grants:
            request, user = queue.pop(grant.lease_id)
            burst = user.next_burst()
            user.waits.append(now - request.arrival)
            user.ran += 1
            user.used_s += user.gpus * _clip(now + SETUP_S, now + SETUP_S + burst)
            held = SETUP_S + burst + RELEASE_S
            world.reserved_s += user.gpus * _clip(now, now + held)
            leases[grant.lease_id] = ActiveLease(
                grant.lease_id, user.name, request.workers, 1.0, request.priority,
                over_quota=grant.over_quota, granted_at=now, node_workers=grant.node_workers)
            heapq.heappush(events, (now + held, seq, "end", grant.lease_id))
            heapq.heappush(events, (now + held + user.think(), seq + 1, "ask", user))
            seq += 2
    return world


def replay_pinned(users: list[User]) -> World:
    """One GPU per open notebook, held until the end of the day."""
    world = World("pinned", users)
    free = sum(int(n.gpus) for n in NODES)
    pinned: set[str] = set()
    events = [(u.opens_at, i, "open", u) for i, u in enumerate(users)]
    events += [(u.opens_at + u.think(), USERS + i, "ask", u) for i, u in enumerate(users)]
    heapq.heapify(events)
    seq = len(events)
    while events and events[0][0] < DAY_S:
        now, _, kind, user = heapq.heappop(events)
        if user.name not in pinned and free:
            pinned.add(user.name)
            free -= 1
            world.reserved_s += DAY_S - now
        if kind == "open":
            continue
        burst = user.next_burst()
        if user.name in pinned and user.gpus == 1:
            user.ran += 1
            user.waits.append(0.0)
            user.used_s += _clip(now, now + burst)
            heapq.heappush(events, (now + burst + user.think(), seq, "ask", user))
        else:
            user.refused += 1
            heapq.heappush(events, (now + user.think(), seq, "ask", user))
        seq += 1
    return world


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else 0.0


def report(worlds: list[World]) -> list[str]:
    rows = [("", *(w.name for w in worlds))]
    rows.append(("GPU-hours reserved", *(f"{w.reserved_s / 3600:.1f}" for w in worlds)))
    rows.append(("GPU-hours used", *(f"{w.used_s / 3600:.1f}" for w in worlds)))
    rows.append(("used / reserved", *(f"{w.used_s / w.reserved_s:.2f}" for w in worlds)))
    rows.append(("users served", *(f"{w.served()} of {USERS}" for w in worlds)))
    rows.append(("bursts run", *(f"{sum(u.ran for u in w.users)}" for w in worlds)))
    rows.append(("bursts not served", *(f"{sum(u.refused for u in w.users)}" for w in worlds)))
    rows.append(("median queue wait", *(f"{statistics.median(w.waits()):.0f} s" for w in worlds)))
    rows.append(("p95 queue wait", *(f"{_p95(w.waits()):.0f} s" for w in worlds)))
    rows.append(("Jain fairness, GPU-h", *(f"{w.fairness():.2f}" for w in worlds)))
    rows.append(("Jain fairness, bursts run", *(f"{w.demand_fairness():.2f}" for w in worlds)))
    width = max(len(r[0]) for r in rows)
    return [f"{r[0]:<{width}}  " + "  ".join(f"{c:>12}" for c in r[1:]) for r in rows]


def sweep(seeds: int) -> None:
    """How much the figures move with the draw (the table below is one seed)."""
    for seed in range(1, seeds + 1):
        ours, pinned = replay_gpusession(draw_users(seed)), replay_pinned(draw_users(seed))
        waits = ours.waits()
        print(f"seed {seed:2d}: used/reserved {ours.used_s / ours.reserved_s:.2f} vs "
              f"{pinned.used_s / pinned.reserved_s:.2f}, served {ours.served()} vs "
              f"{pinned.served()}, wait median {statistics.median(waits):.0f} s "
              f"p95 {_p95(waits):.0f} s")


def main() -> None:
    if "--sweep" in sys.argv:
        sweep(int(sys.argv[sys.argv.index("--sweep") + 1]))
    ours = replay_gpusession(draw_users())
    pinned = replay_pinned(draw_users())
    print(f"{USERS} users, {sum(n.gpus for n in NODES):g} GPUs, {DAY_S / 3600:g} h, seed {SEED}")
    for line in report([ours, pinned]):
        print(line)
    ratio = (ours.used_s / ours.reserved_s) / (pinned.used_s / pinned.reserved_s)
    print(f"users served: {ours.served() / max(pinned.served(), 1):.1f}x the pinned baseline")
    print(f"utilization ratio (gpusession used/reserved over pinned used/reserved): {ratio:.2f}")


if __name__ == "__main__":
    main()
