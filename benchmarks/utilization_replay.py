"""SIMULATED: a day of interactive notebook work replayed through the real policy, against a
Kueue-like FIFO queue with gang admission. Nothing runs on Ray: a virtual clock drives
`gpusession.broker.policy.decide` and `gpusession.broker.elastic.offers` (the functions the
broker calls); its figures are a simulation's, and the README shows them in their own table.

The workload (seeded, SEED below; every figure here is a module constant):
- a cluster of 8 GPUs: 2 nodes x 4 GPUs; 20 users, each opens a notebook in the first hour;
- each user alternates think time (exponential, mean 20 min) with a training burst (lognormal,
  median 5 min at its full size, sigma 0.5); a user's bursts always need the same GPUs:
  1 GPU for 13 users, 2 for 5, 4 for 2 (shuffled);
- a 4-GPU burst is elastic (min 2 workers): under gpusession it runs at priority low, so a
  1- or 2-GPU burst shrinks it to 2 GPUs and the broker offers the GPUs back when they are
  free; its work (GPU-seconds at full size) goes on at the speed of the GPUs it holds;
- costs come from the measured results files, not constants: gpusession's start+release is
  call_overhead.py's warm call median, a resize costs elastic.py's grow-back median; the
  baseline's start is call_overhead.py's torchrun cold median (a job queued there starts a new
  process). Where a file is missing, the constant below is used and the row says so.

The baseline is what a team would run instead of pinning a GPU per notebook: one Kueue-like
ClusterQueue of 8 GPUs, BestEffortFIFO (Kueue's default: a workload that does not fit is set
aside and the next one in order is tried), gang admission of a job's whole GPU count, no
borrowing, no preemption (Kueue's default within a ClusterQueue), no elastic resizing.

Figures for both: used/reserved GPU-hours, users served (every burst they asked for ran), p95
and median queue wait (ask to start, over the bursts that ran), bursts run.

    .venv/bin/python benchmarks/utilization_replay.py            # seed 11, writes results/utilization_replay.json
    .venv/bin/python benchmarks/utilization_replay.py --sweep 20  # seeds 1..20 first, one line each
"""
from __future__ import annotations

import heapq
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import RESULTS, Row, inputs_when, write  # noqa: E402

from gpusession.broker.elastic import offers  # noqa: E402
from gpusession.broker.model import ActiveLease, NodeCapacity, Placement, Priority, Quota, Request  # noqa: E402
from gpusession.broker.policy import decide  # noqa: E402

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


def measured_costs() -> Costs:
    """Start/release/resize costs from the results files of the measured benchmarks."""
    def median_of(name: str, measure_starts: str, key: str):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            return None
        for row in json.loads(path.read_text())["rows"]:
            if row["measure"].startswith(measure_starts) and isinstance(row.get(key), (int, float)):
                return float(row[key])
        return None

    start = median_of("call_overhead", "warm call", "gpusession")
    baseline = median_of("call_overhead", "first call of a new process", "alternative_value")
    resize = median_of("elastic", "GPUs free again", "gpusession")
    used = [name for name, value in (("call_overhead.json warm call", start),
                                     ("call_overhead.json torchrun cold", baseline),
                                     ("elastic.json grow-back", resize)) if value is not None]
    missing = [name for name, value in (("start", start), ("baseline start", baseline), ("resize", resize))
               if value is None]
    source = f"from {', '.join(used) or 'no results file'}" + (
        f"; constants for {', '.join(missing)}" if missing else "")
    return Costs(start if start is not None else FALLBACK_START_S,
                 resize if resize is not None else FALLBACK_RESIZE_S,
                 baseline if baseline is not None else FALLBACK_BASELINE_START_S, source)


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
class Job:
    """A running burst: its work left progresses at `workers` GPU-seconds per second after `since`."""

    user: User
    lease: ActiveLease
    left: float
    since: float  # progress resumes here (after a start or a resize)
    marked: float  # reserved GPU-seconds counted up to here
    version: int = 0

    def advance(self, now: float, world: "World") -> None:
        busy = max(0.0, min(now, DAY_S) - min(max(self.since, self.marked), DAY_S))
        done = min(self.left, self.lease.workers * busy)
        self.left -= done
        self.user.used_s += done
        world.reserved_s += self.lease.workers * max(0.0, min(now, DAY_S) - min(self.marked, DAY_S))
        self.marked = max(self.marked, now)

    def ends_at(self) -> float:
        return max(self.since, self.marked) + self.left / self.lease.workers


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


def replay_gpusession(users: list[User], costs: Costs) -> World:
    world, clock = World("gpusession", users), Clock()
    queue: dict[int, tuple[Request, User, float]] = {}  # id -> (request, user, work)
    jobs: dict[int, Job] = {}
    for user in users:
        clock.at(user.opens_at + user.think(), "ask", user)
    while clock.heap and clock.heap[0][0] < DAY_S:
        now = clock.heap[0][0]
        for _, _, kind, payload, version in clock.due():
            if kind == "ask":
                elastic = payload.gpus > ELASTIC_MIN
                request = Request(world.new_id(), payload.name, payload.gpus, 1.0,
                                  Priority.LOW if elastic else Priority.NORMAL, Placement.PACK, arrival=now,
                                  min_workers=ELASTIC_MIN if elastic else None)
                queue[request.lease_id] = (request, payload, payload.next_work())
            elif payload in jobs and jobs[payload].version == version:
                job = jobs.pop(payload)
                job.advance(now, world)
                clock.at(now + job.user.think(), "ask", job.user)
        _schedule(now, world, clock, queue, jobs, costs)
    for job in jobs.values():
        job.advance(DAY_S, world)
    for request, user, _ in queue.values():
        user.waiting += 1
    return world


def _schedule(now, world, clock, queue, jobs, costs) -> None:
    """decide() until it has nothing more to do at this instant (a shrink frees room for a grant),
    then offer what is free to elastic jobs that shrank."""
    for _ in range(10):
        decision = decide(nodes=NODES, leases=[j.lease for j in jobs.values()],
                          queue=[r for r, _, _ in queue.values()], quotas={}, default_quota=QUOTA,
                          used_gpu_hours={}, allow_borrowing=False, now=now)
        if not decision.grants and not decision.preemptions:
            break
        for preempt in decision.preemptions:
            _preempt(now, world, clock, queue, jobs, preempt, costs)
        for grant in decision.grants:
            request, user, work = queue.pop(grant.lease_id)
            user.waits.append(now - request.arrival)
            user.ran += 1
            lease = ActiveLease(grant.lease_id, user.name, request.workers, 1.0, request.priority,
                                over_quota=grant.over_quota, granted_at=now, node_workers=dict(grant.node_workers),
                                min_workers=request.min_workers, full_workers=request.workers)
            jobs[grant.lease_id] = Job(user, lease, work, now + costs.start_s, now)
            clock.at(jobs[grant.lease_id].ends_at(), "end", grant.lease_id)
    used = {n.node_id: 0.0 for n in NODES}
    for job in jobs.values():
        for node, n in job.lease.node_workers.items():
            used[node] += n
    free = {n.node_id: n.gpus - used[n.node_id] for n in NODES}
    for offer in offers([j.lease for j in jobs.values()], free, [r for r, _, _ in queue.values()]):
        job = jobs[offer.lease_id]
        grown = dict(job.lease.node_workers)
        for node, n in offer.add.items():
            grown[node] = grown.get(node, 0) + n
        _resize(now, world, clock, job, offer.to_workers, grown, costs)


def _preempt(now, world, clock, queue, jobs, preempt, costs) -> None:
    job = jobs[preempt.victim_id]
    if preempt.shrink_to_workers is not None:
        kept = {node: n - (preempt.give_node_workers or {}).get(node, 0) for node, n in job.lease.node_workers.items()}
        _resize(now, world, clock, job, preempt.shrink_to_workers, {k: v for k, v in kept.items() if v}, costs)
        return
    job.advance(now, world)  # stopped: its user runs what is left again, from its checkpoint
    del jobs[preempt.victim_id]
    world.stopped += 1
    request = Request(world.new_id(), job.user.name,
                      job.lease.full_workers or job.lease.workers, 1.0, job.lease.priority, Placement.PACK,
                      arrival=now, min_workers=job.lease.min_workers)
    job.user.ran -= 1
    queue[request.lease_id] = (request, job.user, job.left)


def _resize(now, world, clock, job, workers, node_workers, costs) -> None:
    job.advance(now, world)
    lease = job.lease
    job.lease = ActiveLease(lease.lease_id, lease.user, workers, 1.0, lease.priority, lease.over_quota,
                            lease.granted_at, node_workers=node_workers, min_workers=lease.min_workers,
                            full_workers=lease.full_workers)
    job.since, job.version = now + costs.resize_s, job.version + 1
    world.resizes += 1
    clock.at(job.ends_at(), "end", lease.lease_id, job.version)


def replay_fifo_queue(users: list[User], costs: Costs) -> World:
    """Kueue-like: BestEffortFIFO over one 8-GPU quota, whole jobs admitted or none, no preemption."""
    world, clock = World("FIFO gang queue", users), Clock()
    capacity = sum(int(n.gpus) for n in NODES)
    free, queue, ends = capacity, [], {}
    for user in users:
        clock.at(user.opens_at + user.think(), "ask", user)
    while clock.heap and clock.heap[0][0] < DAY_S:
        now = clock.heap[0][0]
        for _, _, kind, payload, _ in clock.due():
            if kind == "ask":
                queue.append((now, payload, payload.next_work()))
            else:
                free += payload.gpus
                clock.at(now + payload.think(), "ask", payload)
        for item in list(queue):  # in arrival order; one that does not fit is passed over
            asked_at, user, work = item
            if user.gpus <= free:
                queue.remove(item)
                free -= user.gpus
                user.waits.append(now - asked_at)
                user.ran += 1
                held = costs.baseline_start_s + work / user.gpus
                user.used_s += user.gpus * max(0.0, min(now + held, DAY_S) - min(now + costs.baseline_start_s, DAY_S))
                world.reserved_s += user.gpus * max(0.0, min(now + held, DAY_S) - now)
                clock.at(now + held, "end", user)
    for _, user, _ in queue:
        user.waiting += 1
    return world


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else 0.0


def figures(world: World) -> dict:
    waits = world.waits()
    return {"used/reserved": world.used_s() / world.reserved_s, "served": world.served(),
            "p95": p95(waits), "median": statistics.median(waits) if waits else 0.0,
            "bursts": sum(u.ran for u in world.users)}


def rows(ours: dict, theirs: dict, costs: Costs, resizes: int) -> list[Row]:
    configured = (f"gpusession: policy.decide, quota 4 GPUs a user, no borrowing, 4-GPU bursts elastic (min 2, "
                  f"priority low), start+release {costs.start_s:.2f} s, resize {costs.resize_s:.2f} s ({resizes} "
                  f"resizes); queue: BestEffortFIFO, gang admission of whole GPUs, no borrowing or preemption, "
                  f"start {costs.baseline_start_s:.2f} s; costs {costs.source}; seed {SEED}")
    alternative = "Kueue-like FIFO gang queue"

    def row(measure, unit, key, goal=""):
        return Row(measure, unit, [ours[key]], alternative, [theirs[key]], configured, goal)

    return [row("used / reserved GPU-hours, 20 users, 8 GPUs, 8 h", "", "used/reserved"),
            row("users served (every burst asked ran)", "users", "served"),
            row("bursts run", "", "bursts"),
            row("p95 queue wait", "s", "p95"), row("median queue wait", "s", "median")]


def sweep(seeds: int, costs: Costs) -> None:
    """How much the figures move with the draw (the results file is one seed)."""
    for seed in range(1, seeds + 1):
        ours = figures(replay_gpusession(draw_users(seed), costs))
        theirs = figures(replay_fifo_queue(draw_users(seed), costs))
        print(f"seed {seed:2d}: used/reserved {ours['used/reserved']:.2f} vs {theirs['used/reserved']:.2f}, "
              f"served {ours['served']} vs {theirs['served']}, p95 wait {ours['p95']:.0f} vs {theirs['p95']:.0f} s")


def main() -> None:
    costs = measured_costs()
    if "--sweep" in sys.argv:
        sweep(int(sys.argv[sys.argv.index("--sweep") + 1]), costs)
    world = replay_gpusession(draw_users(), costs)
    ours, theirs = figures(world), figures(replay_fifo_queue(draw_users(), costs))
    print(f"SIMULATED: {USERS} users, {sum(n.gpus for n in NODES):g} GPUs, {DAY_S / 3600:g} h, seed {SEED}; "
          f"costs {costs.source}")
    for key in ours:
        print(f"{key:>14}: gpusession {ours[key]:.2f}  FIFO gang queue {theirs[key]:.2f}")
    path = write("utilization_replay", rows(ours, theirs, costs, world.resizes), simulated=True,
                 measures=["gpusession/broker"], derived_from=inputs_when(["call_overhead", "elastic"]))
    print(f"wrote {path}")
    print(f"used/reserved ratio (gpusession / FIFO gang queue, simulated): "
          f"{ours['used/reserved'] / theirs['used/reserved']:.2f}")


if __name__ == "__main__":
    main()
