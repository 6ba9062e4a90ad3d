"""The Kueue-like baseline of the utilization replay: one ClusterQueue of whole-job (gang)
admission, BestEffortFIFO, and a variant with WorkloadPriorityClasses and LowerPriority preemption
within the ClusterQueue."""
from __future__ import annotations

from dataclasses import dataclass

from _replay_world import DAY_S, ELASTIC_MIN, NODES, Clock, Costs, User, World

@dataclass
class Admitted:
    """A burst the queue admitted: its whole GPU count from `start`, working after the start cost."""

    user: User
    priority: int
    work: float  # GPU-seconds left when admitted
    start: float
    version: int


def replay_kueue(users: list[User], costs: Costs, *, preemption: bool = False) -> World:
    """Kueue-like: one 8-GPU ClusterQueue, BestEffortFIFO (in priority order, then arrival), whole
    jobs admitted or none, no elastic resizing. With preemption: WorkloadPriorityClasses (the
    elastic 4-GPU bursts low, the rest normal, as gpusession's run them) and
    withinClusterQueue: LowerPriority, so a normal burst that does not fit evicts low ones (whole:
    Kueue cannot shrink a job); an evicted burst is requeued with its work left (from its
    checkpoint) and pays the start again (Kueue's default requeue: ordered by the eviction time)."""
    world = World("Kueue priority + preemption" if preemption else "FIFO gang queue", users)
    clock, free = Clock(), sum(int(n.gpus) for n in NODES)
    queue: list[tuple[int, float, User, float]] = []  # (priority, asked at, user, work)
    running: dict[str, Admitted] = {}
    for user in users:
        clock.at(user.opens_at + user.think(), "ask", user)
    while clock.heap and clock.heap[0][0] < DAY_S:
        now = clock.heap[0][0]
        for _, _, kind, user, version in clock.due():
            if kind == "ask":
                low = preemption and user.gpus > ELASTIC_MIN
                queue.append((0 if low else 1, now, user, user.next_work()))
            elif user.name in running and running[user.name].version == version:
                free += _stop(now, world, running.pop(user.name), costs)
                clock.at(now + user.think(), "ask", user)
        queue.sort(key=lambda item: (-item[0], item[1]))
        for item in list(queue):  # in order; one that does not fit is passed over (BestEffortFIFO)
            priority, asked_at, user, work = item
            if user.gpus > free and preemption:
                free += _evict_for(now, world, item, running, queue, costs, free)
            if user.gpus <= free:
                queue.remove(item)
                free -= user.gpus
                user.waits.append(now - asked_at)
                user.ran += 1
                job = Admitted(user, priority, work, now, world.new_id())
                running[user.name] = job
                clock.at(now + costs.baseline_start_s + work / user.gpus, "end", user, job.version)
    for job in running.values():
        _stop(DAY_S, world, job, costs)
    for _, _, user, _ in queue:
        user.waiting += 1
    return world


def _stop(now: float, world: World, job: Admitted, costs: Costs) -> int:
    """Count a burst's reserved and used GPU-seconds up to now; its GPUs, freed."""
    end = min(now, DAY_S)
    working = max(0.0, end - min(job.start + costs.baseline_start_s, DAY_S))
    done = min(job.work, job.user.gpus * working)
    job.user.used_s += done
    job.work -= done
    world.reserved_s += job.user.gpus * max(0.0, end - min(job.start, DAY_S))
    return job.user.gpus


def _evict_for(now, world, item, running, queue, costs, free) -> int:
    """Kueue's LowerPriority preemption: evict low-priority bursts, newest first, until ITEM fits
    (none if it would not fit even then); each evicted burst is queued again for its work left."""
    priority, _, user, _ = item
    lower = sorted((j for j in running.values() if j.priority < priority), key=lambda j: -j.start)
    if free + sum(j.user.gpus for j in lower) < user.gpus:
        return 0
    freed = 0
    for job in lower:
        if free + freed >= user.gpus:
            break
        del running[job.user.name]
        freed += _stop(now, world, job, costs)
        world.stopped += 1
        job.user.ran -= 1  # as gpusession's replay counts a stopped burst: asked again, from its checkpoint
        queue.append((job.priority, now, job.user, job.work))
    return freed
