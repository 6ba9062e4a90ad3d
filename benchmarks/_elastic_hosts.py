"""elastic.py's like-for-like comparison on simulated hosts (tests/multihost/simcluster.py: a head
and 2 hosts x 2 logical GPUs): both sides start at 4 GPUs with a floor of 2; the host without
rank 0 is killed and both go on at 2; the host comes back (a fresh Ray node); measured on both
sides the same way: from the moment Ray lists the host's GPUs alive again (a driver on the head
polling Ray's node table every 0.1 s) to the first step made at 4 GPUs after it."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from multihost import Deaths
from tests.multihost.simcluster import SimCluster, kill_session

DRIVER = str(Path(__file__).resolve().parent / "_elastic_hosts_driver.py")
GPUS = 4
RUNNING_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sample:
    back_s: float | None  # Ray lists the host's GPUs alive -> first step at 4 (None: not within the watch)
    at_2_s: float | None  # the host killed -> first step at 2 (None: the run never went on at 2)
    watched_s: float  # how long the return to 4 was watched


def steps(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def first_step(log: Path, *, world_size: int, after: float) -> float | None:
    return next((s["at"] for s in steps(log) if s["at"] > after and s["world_size"] == world_size), None)


def wait_for(predicate, timeout_s: float, proc) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def restart_watched(cluster: SimCluster, victim) -> dict:
    """Restart the lost host once a driver on the head polls Ray's node table; when that driver
    first saw the host's GPUs alive, and what it saw before the restart."""
    watcher = cluster.python(cluster.head, DRIVER, "alive", str(GPUS), "300")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watcher.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any(line.startswith("WATCHING") for line in list(lines)):
        if watcher.poll() is not None or time.monotonic() > deadline:
            kill_session(watcher)
            raise SystemExit(f"the watcher of Ray's node table did not start:\n{''.join(lines)[-3000:]}")
        time.sleep(0.05)
    cluster.restart_host(victim)
    watcher.wait(timeout=330)
    reader.join(10)
    return json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])


def sample(cluster: SimCluster, deaths: Deaths, side: str, tag: str, interval_s: float = 60.0) -> Sample:
    """One run of SIDE ("gpusession" or "ray-train") through the loss and the return of a host."""
    log, stop = cluster.base / f"elastic-{tag}.jsonl", cluster.base / f"elastic-{tag}.stop"
    args = [side, str(log), str(stop)] + ([str(interval_s)] if side == "ray-train" else [])
    proc = cluster.python(cluster.head, DRIVER, *args)
    output: list[str] = []  # read as it comes: Ray Train is chatty, and a full pipe would stall it
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        running = wait_for(lambda: sum(1 for s in steps(log) if s["world_size"] == GPUS) >= 5, RUNNING_TIMEOUT_S, proc)
        if not running:
            raise SystemExit(f"{side} never ran 5 steps at {GPUS} GPUs:\n{''.join(output)[-3000:]}")
        rank0_host = steps(log)[-1]["host"]
        victim = next(h for h in cluster.workers if h.name != rank0_host)
        lost_at = time.time()
        cluster.kill_host(victim)
        at_2 = wait_for(lambda: first_step(log, world_size=2, after=lost_at), RUNNING_TIMEOUT_S, proc)
        deaths.after_try(victim, side)  # Ray declared the old node dead: its restart cannot race that
        seen = restart_watched(cluster, victim)
        if seen["alive_at"] is None or seen["first_total"] >= GPUS:
            raise SystemExit(f"Ray did not list {GPUS} GPUs alive after the restart, or already did before it: {seen}")
        watch_s = interval_s * 3 + 180 if side == "ray-train" else 180.0
        back = wait_for(lambda: first_step(log, world_size=GPUS, after=seen["alive_at"]), watch_s, proc)
    finally:
        stop.write_text("stop")
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            kill_session(proc)
        reader.join(10)
    print(f"--- {side}: went on at 2 after {at_2 and at_2 - lost_at}, back at 4 after "
          f"{back and back - seen['alive_at']} s; driver's last lines:\n{''.join(output[-5:])}", flush=True)
    return Sample(back - seen["alive_at"] if back else None, at_2 - lost_at if at_2 else None, watch_s)
