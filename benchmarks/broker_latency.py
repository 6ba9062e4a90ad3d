"""The broker's loop never blocks: p99 of a scheduling call while 50 clients request and release
GPUs, first alone, then while an admin asks for ten years of usage by day again and again.

    .venv/bin/python benchmarks/broker_latency.py [--seconds 10] [--clients 50] [--years 10]

The ledger is seeded with `--years` of history (a lease every few hours, each one to three days
long) before the broker starts. Figures are measured inside the broker (`timings`): `request`
is one request handled (checked, admitted, scheduled, granted, committed to the ledger);
`loop_lag` is how late the event loop runs a 50 ms timer, which every caller waits on top of its
own work. Target: request p99 < 10 ms during the usage queries. The last line is that figure
and its ratio to the figure without the queries.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _cluster import local_cluster  # noqa: E402

YEAR_S = 365.25 * 86400


def seed_ledger(path: Path, *, years: float, now: float) -> int:
    """Years of finished leases (a lease every 4 h, 1-3 days long, 5 users), written directly."""
    from gpusession.broker.ledger import Ledger

    ledger = Ledger(path)
    rng = random.Random(7)
    rows, start = [], now - years * YEAR_S
    t = start
    while t < now - 4 * 86400:
        gpus = rng.choice([0.5, 1.0, 2.0])
        held = rng.uniform(1, 3) * 86400
        rows.append((uuid.uuid4().hex, f"user{rng.randrange(5)}", "ff", gpus, 1, gpus, 1, "pack", "ended",
                     t - 10, t, t, t + held, "finished", gpus * held))
        t += 4 * 3600
    with ledger.db.conn:
        ledger.db.conn.executemany(
            "insert into leases (request_id, user, job_id, gpus, workers, gpus_per_worker, priority, placement, "
            "state, requested_at, granted_at, placed_at, released_at, end_reason, gpu_seconds) "
            "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)


def run_clients(broker, clients: int, seconds: float) -> list[float]:
    """Each client: request 0.25 GPU, release it, again; returns the round trips (s)."""
    import ray

    from gpusession.broker import client

    job = ray.get_runtime_context().get_job_id()
    trips: list[float] = []
    stop = time.monotonic() + seconds
    errors: list[BaseException] = []

    def loop(index: int) -> None:
        user = f"client{index % 7}"
        auth = {"user": user, "job_id": job}
        try:
            while time.monotonic() < stop:
                started = time.perf_counter()
                view = client.call(broker.request, {"request_id": uuid.uuid4().hex, "user": user, "job_id": job,
                                                    "workers": 1, "gpus_per_worker": 0.25})
                trips.append(time.perf_counter() - started)
                client.call(broker.release, view["lease_id"], "finished", auth=auth)
        except BaseException as exc:  # reported below: a failing client must fail the benchmark
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return trips


def usage_loop(broker, admin: dict, stop: threading.Event, durations: list[float]) -> None:
    from gpusession.broker import client

    while not stop.is_set():
        started = time.perf_counter()
        client.call(broker.usage, admin, 0.0, 253402300799.0, "day", timeout=600)  # 1970 to 9999-12-31
        durations.append(time.perf_counter() - started)


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def phase(broker, admin, *, clients: int, seconds: float, with_usage: bool) -> tuple[dict, float, list[float]]:
    from gpusession.broker import client

    client.call(broker.timings, admin, True)  # start a new measurement
    stop, durations = threading.Event(), []
    reader = threading.Thread(target=usage_loop, args=(broker, admin, stop, durations)) if with_usage else None
    if reader:
        reader.start()
        time.sleep(0.5)  # the first query is under way
    trips = run_clients(broker, clients, seconds)
    stop.set()
    if reader:
        reader.join()
    return client.call(broker.timings, admin), p99(trips), durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each phase runs")
    parser.add_argument("--clients", type=int, default=50, help="client threads requesting and releasing")
    parser.add_argument("--years", type=float, default=10.0, help="years of history in the ledger")
    args = parser.parse_args()
    with local_cluster():
        import ray  # noqa: F401

        from gpusession.broker import client

        home = Path(os.environ["GPUSESSION_HOME"])
        seeded = seed_ledger(home / "ledger.db", years=args.years, now=time.time())
        broker = client.broker()
        admin = {"token": (home / "admin_token").read_text().strip(), "user": "admin"}
        started = time.perf_counter()
        days = client.call(broker.usage, admin, 0.0, 253402300799.0, "day", timeout=600)
        alone_s = time.perf_counter() - started
        quiet, quiet_trip, _ = phase(broker, admin, clients=args.clients, seconds=args.seconds, with_usage=False)
        busy, busy_trip, queries = phase(broker, admin, clients=args.clients, seconds=args.seconds, with_usage=True)
    print(f"ledger: {seeded} leases over {args.years:g} years; usage 1970-9999 by day: {len(days)} rows in "
          f"{alone_s * 1e3:.0f} ms")
    for name, figures, trip in (("alone", quiet, quiet_trip), ("with usage queries", busy, busy_trip)):
        request, lag = figures.get("request", {}), figures.get("loop_lag", {})
        print(f"{name:>20}: {request.get('n', 0)} requests, broker p99 {request.get('p99_ms')} ms "
              f"(p50 {request.get('p50_ms')} ms), decide p99 {figures.get('decide', {}).get('p99_ms')} ms, "
              f"loop lag p99 {lag.get('p99_ms')} ms, client round trip p99 {trip * 1e3:.1f} ms")
    print(f"usage queries during the second phase: {len(queries)}, each {1e3 * sum(queries) / max(1, len(queries)):.0f} ms")
    decide, request = busy["decide"]["p99_ms"], busy["request"]["p99_ms"]
    ratio = request / quiet["request"]["p99_ms"]
    print(f"p99 with {args.clients} clients and ten-year usage queries: scheduling decision {decide:.2f} ms "
          f"(target < 10 ms), request {request:.2f} ms ({ratio:.2f}x without the queries)")


if __name__ == "__main__":
    main()
