"""SIMULATED: a day of interactive notebook work replayed through the real policy, against a
Kueue-like queue with gang admission, with and without priorities and preemption. Nothing runs on Ray: a virtual clock drives
`gpusession.broker.policy.policy.decide` and `gpusession.broker.policy.elastic.offers` (the functions the
broker calls); its figures are a simulation's, and docs/speed.md shows them in their own table.

The workload (seeded; every figure here is a constant of _replay_world.py):
- a cluster of 8 GPUs: 2 nodes x 4 GPUs; 20 users, each opens a notebook in the first hour;
- each user alternates think time (exponential, mean 20 min) with a training burst (lognormal,
  median 5 min at its full size, sigma 0.5); a user's bursts always need the same GPUs:
  1 GPU for 13 users, 2 for 5, 4 for 2 (shuffled);
- a 4-GPU burst is elastic (min 2 workers): under gpusession it runs at priority low, so a
  1- or 2-GPU burst shrinks it to 2 GPUs and the broker offers the GPUs back when they are
  free; its work (GPU-seconds at full size) goes on at the speed of the GPUs it holds;
- costs come from the measured results files, not constants: gpusession's start+release is
  call_overhead.py's warm call median, a resize costs elastic.py's grow-back median. By default
  (--costs equal) the queue's start costs the same as gpusession's: a start measured differently
  on the two sides (a torchrun cold start at another load) would decide the result by itself;
  --costs measured charges the queue call_overhead.py's torchrun cold median instead. Where a
  file is missing, the constant in _replay_world.py is used and the rows say so. The file records
  when its inputs were measured (report.py refuses it once they are re-measured).

Two baselines (benchmarks/_kueue_baseline.py), what a team would run instead of pinning a GPU
per notebook: one Kueue-like ClusterQueue of 8 GPUs, gang admission of a job's whole GPU count,
no borrowing, no elastic resizing; (1) BestEffortFIFO (Kueue's default: a workload that does not
fit is set aside and the next one in order is tried), no preemption (Kueue's default within a
ClusterQueue); (2) WorkloadPriorityClasses (the elastic 4-GPU bursts low, the rest normal, as
under gpusession) with withinClusterQueue: LowerPriority preemption: a normal burst that does not
fit evicts low ones, whole, and they are requeued with the work they have left.

Figures for each: used/reserved GPU-hours, users served (every burst they asked for ran), p95
and median queue wait (ask to start, over the bursts that ran), bursts run; over seeds 1..N
(--seeds, 10 by default), each seed a sample, so every row shows the spread, and the per-seed
ratio's spread beside it.

    .venv/bin/python benchmarks/utilization_replay.py [--seeds 10] [--costs equal|measured]
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kueue_baseline import replay_kueue  # noqa: E402
from _replay_world import (DAY_S, ELASTIC_MIN, FALLBACK_BASELINE_START_S, FALLBACK_RESIZE_S,  # noqa: E402
                           FALLBACK_START_S, NODES, QUOTA, USERS, Clock, Costs, User, World, draw_users, figures)
from _results import RESULTS, Row, inputs_when, spread, write  # noqa: E402

from gpusession.broker.policy.elastic import offers  # noqa: E402
from gpusession.broker.policy.model import ActiveLease, Placement, Priority, Request  # noqa: E402
from gpusession.broker.policy.policy import decide  # noqa: E402


def resize_input() -> str:
    """The results file the resize cost comes from."""
    return "elastic-preemption" if (RESULTS / "elastic-preemption.json").exists() else "elastic"


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
    # the grow-back after a preemption (elastic.py --preemption); an older elastic.json held it
    resize_file = resize_input()
    resize = median_of(resize_file, "GPUs free again", "gpusession")
    used = [name for name, value in (("call_overhead.json warm call", start),
                                     ("call_overhead.json torchrun cold", baseline),
                                     (f"{resize_file}.json grow-back", resize)) if value is not None]
    missing = [name for name, value in (("start", start), ("baseline start", baseline), ("resize", resize))
               if value is None]
    source = f"from {', '.join(used) or 'no results file'}" + (
        f"; constants for {', '.join(missing)}" if missing else "")
    return Costs(start if start is not None else FALLBACK_START_S,
                 resize if resize is not None else FALLBACK_RESIZE_S,
                 baseline if baseline is not None else FALLBACK_BASELINE_START_S, source)


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


VARIANTS = {"fifo": "Kueue-like FIFO gang queue", "priority": "Kueue-like gang queue with priorities and preemption"}


def equal_costs(costs: Costs) -> Costs:
    """Both sides pay gpusession's measured start: the sign of the result cannot come from a
    start cost measured differently on each side (the conservative choice for gpusession)."""
    return Costs(costs.start_s, costs.resize_s, costs.start_s,
                 f"{costs.source}; the queue's start set equal to gpusession's")


def replay_seeds(seeds: list[int], costs: Costs) -> dict:
    """Per seed: gpusession's figures and each baseline variant's, and gpusession's resizes."""
    out = {"gpusession": [], "resizes": [], **{variant: [] for variant in VARIANTS}}
    for seed in seeds:
        world = replay_gpusession(draw_users(seed), costs)
        out["gpusession"].append(figures(world))
        out["resizes"].append(world.resizes)
        for variant in VARIANTS:
            out[variant].append(figures(replay_kueue(draw_users(seed), costs, preemption=variant == "priority")))
    return out


def rows(replayed: dict, costs: Costs, seeds: list[int]) -> list[Row]:
    measures = [("used / reserved GPU-hours, 20 users, 8 GPUs, 8 h", "", "used/reserved"),
                ("users served (every burst asked ran)", "users", "served"), ("bursts run", "", "bursts"),
                ("p95 queue wait", "s", "p95"), ("median queue wait", "s", "median")]
    out = []
    for variant, alternative in VARIANTS.items():
        queue = ("BestEffortFIFO, no preemption (Kueue's default within a ClusterQueue)" if variant == "fifo" else
                 "WorkloadPriorityClass (4-GPU bursts low, the rest normal), withinClusterQueue: LowerPriority "
                 "(whole low bursts evicted, requeued with their work left)")
        configured = (f"gpusession: policy.decide, quota 4 GPUs a user, no borrowing, 4-GPU bursts elastic (min 2, "
                      f"priority low), start+release {costs.start_s:.2f} s, resize {costs.resize_s:.2f} s; queue: "
                      f"one 8-GPU ClusterQueue, gang admission of whole GPUs, no borrowing, {queue}, start "
                      f"{costs.baseline_start_s:.2f} s; costs {costs.source}; seeds {seeds[0]}-{seeds[-1]} "
                      f"({len(seeds)}), each a sample")
        for measure, unit, key in measures:
            ours = [f[key] for f in replayed["gpusession"]]
            theirs = [f[key] for f in replayed[variant]]
            ratios = [a / b for a, b in zip(ours, theirs) if b]
            note = (f"per-seed ratio {statistics.median(ratios):.3g} ({min(ratios):.3g}-{max(ratios):.3g})"
                    if ratios and key != "median" else "")
            out.append(Row(measure, unit, ours, alternative, theirs, configured, note=note))
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="replay seeds 1..N, each a sample (at least 10)")
    parser.add_argument("--costs", choices=("equal", "measured"), default="equal",
                        help="equal: the queue pays gpusession's measured start too; measured: each side its own "
                             "(the queue a torchrun cold start)")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a trial run that must not replace the file)")
    args = parser.parse_args()
    costs = measured_costs() if args.costs == "measured" else equal_costs(measured_costs())
    seeds = list(range(1, args.seeds + 1))
    replayed = replay_seeds(seeds, costs)
    print(f"SIMULATED: {USERS} users, {sum(n.gpus for n in NODES):g} GPUs, {DAY_S / 3600:g} h, seeds "
          f"{seeds[0]}-{seeds[-1]}; costs {costs.source}")
    for row in rows(replayed, costs, seeds):
        print(f"{row.measure} vs {row.alternative}: gpusession {spread(row.gpusession_samples)}, "
              f"queue {spread(row.alternative_samples)}; {row.note}")
    path = write("utilization_replay", rows(replayed, costs, seeds), simulated=True,
                 measures=["gpusession/broker", "benchmarks/_replay_world.py", "benchmarks/_kueue_baseline.py"],
                 derived_from=inputs_when(["call_overhead", resize_input()]), details={"per_seed": replayed},
                 folder=Path(args.out) if args.out else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
