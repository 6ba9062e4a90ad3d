"""Attaching to a detached run (issue 32): how long `gs.attach(run_id).result()` takes for a run
that already finished, and, for a live one, how long the attach takes to replay its history and
how late the next live update arrives, side by side in one run.

    .venv/bin/python benchmarks/attach.py [--samples 5]

A local head with 4 logical GPUs (`gpusession cluster start`'s, in a private GPUSESSION_HOME);
this process is a one-user kernel with RAY_ADDRESS, so its first detach starts the user's own
gateway (gateway/usergateway.py), which hosts the runs; the hub's gateway is the same code.

  finished  `gs.attach(id).result()` of a finished detached run whose value is 1 MB, against the
            usual Ray way to leave a value for later: a named detached actor holding it,
            `ray.get(ray.get_actor(name).value.remote())` from this (already connected) driver.
            One untimed attach of each first; samples alternated, each on another run/actor.
  live      a detached 1-GPU run reporting every 0.5 s with the rank's clock in its metrics:
            attach (the same calls as gs.attach: open_attach, follow_attached), then the time
            until the history so far has arrived (every report sent before the attach), and the
            next update's delay (its arrival minus the rank's clock when it sent it; one
            machine, one clock). Ray has nothing to attach to a live run's metrics: no figure.

Writes benchmarks/results/attach.json. Goals (issue 32): a finished run's result within 0.5 s;
a live run's history and next update within 1 s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _results import Row, spread, write  # noqa: E402

VALUE_BYTES = 1_000_000
TICK_S = 0.5
NAMESPACE = "gpusession-bench-attach"  # the named actors' (a detached actor needs a namespace to be found again)


def finished_runs(gs, count: int) -> list[str]:
    @gs.distributed(gpus=1)
    def produce(seed):
        return bytes([seed % 256]) * VALUE_BYTES

    ids = []
    for seed in range(count):
        run = produce.submit(seed, detach=True, max_duration=600)
        run.result()
        ids.append(run.run_id)
    return ids


def keepers(count: int) -> list[str]:
    import ray

    @ray.remote(num_cpus=0)
    class Keeper:
        def __init__(self, value):
            self.kept = value

        def value(self):
            return self.kept

    names = [f"gs-bench-attach-{os.getpid()}-{i}" for i in range(count)]
    handles = [Keeper.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(bytes([i % 256]) * VALUE_BYTES)
               for i, name in enumerate(names)]
    ray.get([h.value.remote() for h in handles])  # each holds its value before any is timed
    return names


def attach_finished(gs, run_id: str) -> float:
    started = time.perf_counter()
    value = gs.attach(run_id).result()
    elapsed = time.perf_counter() - started
    assert len(value) == VALUE_BYTES
    return elapsed


def get_kept(name: str) -> float:
    import ray

    started = time.perf_counter()
    value = ray.get(ray.get_actor(name, namespace=NAMESPACE).value.remote())
    elapsed = time.perf_counter() - started
    assert len(value) == VALUE_BYTES
    return elapsed


def attach_live(run_id: str) -> tuple[float, float]:
    """(seconds until every report sent before the attach has arrived, the next report's delay)."""
    from gpusession.observe.events import Observer, RunInfo
    from gpusession.gateway.reattach import follow_attached, open_attach

    arrivals: list[tuple[float, dict]] = []
    got_next = threading.Event()
    asked = time.time()

    class Recorder(Observer):
        def report(self, metrics, info):
            arrivals.append((time.time(), dict(metrics)))
            if metrics.get("sent", 0) >= asked:
                got_next.set()

    conn, path, record = open_attach(run_id)

    def follow():
        try:
            follow_attached(conn, path, record, RunInfo(), Recorder())
        except Exception:  # the connection closed below: following ends, the run goes on
            pass

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    if not got_next.wait(30):
        raise SystemExit("no live update within 30 s of attaching")
    conn.close()
    thread.join(10)
    history = [at for at, metrics in arrivals if metrics["sent"] < asked]
    following = next((at, metrics) for at, metrics in arrivals if metrics["sent"] >= asked)
    return (max(history) - asked if history else 0.0), following[0] - following[1]["sent"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    loadavg = os.getloadavg()
    home = tempfile.mkdtemp(prefix="gpusession-bench-attach-")
    os.environ["GPUSESSION_HOME"] = home
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_AUTH_MODE"] = "token"  # before anything imports Ray (the head's start does): Ray reads it then
    from gpusession.cluster import localhead

    head, _ = localhead.start(gpus=4, timeout_s=240)
    os.environ.update(head.client_env())
    names: list[str] = []
    try:
        import ray

        import gpusession as gs

        ids = finished_runs(gs, args.samples + 1)
        from gpusession.cluster.raycluster import ensure_connected

        ensure_connected()  # this process joins the head as a Ray driver too (for the actors), as gpusession joins
        names = keepers(args.samples + 1)
        attach_finished(gs, ids[0])  # warm-up alike: one untimed of each
        get_kept(names[0])
        ours, theirs = [], []
        for run_id, name in zip(ids[1:], names[1:]):
            ours.append(attach_finished(gs, run_id))
            theirs.append(get_kept(name))
        print(f"finished: attach {spread(ours)} s, named actor {spread(theirs)} s", flush=True)

        @gs.distributed(gpus=1)
        def ticking(ticks):
            import time
            for i in range(ticks):
                gs.report(step=i + 1, sent=time.time())
                time.sleep(TICK_S)
            return ticks

        live = ticking.submit(int(args.samples * 6 / TICK_S) + 20, detach=True, max_duration=600)
        while not any(r.run_id == live.run_id and r.reports >= 5 for r in gs.runs(all=True)):
            time.sleep(0.2)
        histories, delays = [], []
        for _ in range(args.samples):
            history, delay = attach_live(live.run_id)
            histories.append(history)
            delays.append(delay)
        live.cancel()
        print(f"live: history {spread(histories)} s, next update {spread(delays)} s", flush=True)
        # its end, before the gateway is stopped below (stopped first, the kernel never heard the end
        # and its receipt said so)
        if live.wait(120):
            print(f"live run cancelled: {type(live.exception()).__name__}, state {live.state.value}, end reason "
                  f"{live.info.end_reason}, GPUs released: {live.info.released}", flush=True)
        else:
            print("live run: not ended 120 s after its cancel", flush=True)
    finally:
        for name in names:
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
            except Exception:
                pass
        stop_user_gateways(Path(home))
        localhead.end(head, timeout_s=60)
        shutil.rmtree(home, ignore_errors=True)  # the head's ledger, keys and the user's gateway's folder
    configured = ("a local head, 4 logical GPUs; this process a one-user kernel with RAY_ADDRESS, its detached "
                  "runs hosted by the user's own gateway; one untimed attach first, samples alternated")
    write("attach", [
        Row("attach to a finished detached run: gs.attach(id).result() of a 1 MB value", "s", ours,
            alternative="a named detached Ray actor holding the value: ray.get(ray.get_actor(name).value.remote())",
            alternative_samples=theirs, configured=configured, goal="<= 0.5 s"),
        Row("attach to a live detached run: its history (every report sent before the attach) arrived", "s",
            histories, alternative="nothing in Ray attaches to a live run's metrics", alternative_cannot=True,
            configured=configured + f"; the run reports every {TICK_S} s", goal="<= 1 s"),
        Row("attach to a live detached run: the next update's delay (arrival minus the rank's clock)", "s", delays,
            alternative="nothing in Ray attaches to a live run's metrics", alternative_cannot=True,
            configured=configured + f"; the run reports every {TICK_S} s", goal="<= 1 s"),
    ], loadavg_before=loadavg)


def stop_user_gateways(home: Path) -> None:
    from gpusession.cluster.localhead import terminate
    from gpusession.gateway import usergateway

    for folder in (home / usergateway.GATEWAYS_DIR).glob("*"):
        found = usergateway.record(folder)
        if found:
            terminate(int(found["pid"]), timeout_s=15)


if __name__ == "__main__":
    main()
