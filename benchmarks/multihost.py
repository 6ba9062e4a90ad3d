"""gpusession vs Ray Train on one simulated cluster (tests/multihost: a head and 2 hosts x 2
logical GPUs, each host a network namespace with its own address and hostname), side by side.
Needs root.

    sudo .venv/bin/python benchmarks/multihost.py                # everything, ratios last
    sudo .venv/bin/python benchmarks/multihost.py --calls [--repeats 5] [--fits 6] [--firsts 5]
    sudo .venv/bin/python benchmarks/multihost.py --node-loss kill|cut [--tries 1]
    sudo .venv/bin/python benchmarks/multihost.py --move [--tries 1]
    sudo .venv/bin/python benchmarks/multihost.py --data [--mb 400] [--tries 2]
    sudo .venv/bin/python benchmarks/multihost.py ... --ray-health-check-s 1   # Ray's health check tuned

Samples: --tries (default 5) of each loss and of the data calls, gpusession's and Ray Train's
alternated. Writes benchmarks/results/multihost.json (multihost-tuned.json with
--ray-health-check-s), merging: a part run alone replaces its own rows and keeps the others. A side
that did not react within the watch window gets "no error within N s" and no ratio: a watch window
is not a measurement. Between tries the lost host comes back as a new Ray node (one Ray declared
dead never rejoins under its old id) and the next try waits until Ray shows all 4 GPUs alive and
free; a node Ray declares dead besides the lost host (a false death: a health check too tight for
the machine) is printed, and said in the rows.

calls: a 4-rank run spread over both hosts (all-reduce one tensor over 4 gloo ranks, one per
logical GPU), @gs.distributed vs TorchTrainer, from a driver on the head. "first" is the first call
of a new driver process on a running cluster (the broker already exists): once on the cluster's
first call, when each host's workers start (gpusession's node hosts and warm parents, Ray Train's
worker processes), then in --firsts more drivers a side once it ran calls (alternated, the first
side flipped each round); "repeat" the calls after the first. The repeat calls are also set beside
the warm Ray baseline: a long-lived pool of 4 actors holding a GPU each and their gloo group
between calls (benchmarks/_ray_pool.py), run after gpusession's calls and before Ray Train's fits
(each side takes all 4 GPUs while it runs).

node loss (kill, cut): what a user sees when the host that does not hold rank 0 of a 4-rank run
dies mid-run (kill: every process on it frozen together and SIGKILLed, so none runs another
instruction, as when a host loses power: tests/multihost/hostkill.py) or goes silent (cut: its link
down): for gpusession, time to the error, which rank and host the error names, when Ray and the
broker show the survivors' GPUs free, and what a 4-GPU request made right after the error gets;
then the same loss under TorchTrainer with FailureConfig(max_failures=0) (the run cannot go on on
the GPUs left, so the fair comparison is how soon it errs; with max_failures=1 it would wait for 4
GPUs that cannot come back): time until its driver hears of it. Ray declares a host dead by its
health checks (RAY_health_check_period_ms, _timeout_ms, _failure_threshold, set on the head);
--ray-health-check-s lowers them the way GPUSESSION_HOST_SILENCE_S lowers gpusession's.

move: a 2-rank run (one rank per host, checkpoint every step) whose host without rank 0 is
killed: time from the kill to the next step, made on the host that remains (gpusession moves
the lost rank to its free GPU at once; Ray Train, FailureConfig(max_failures=1), restarts there
once Ray declares the host dead).

data: the bytes that reach each host when a call's argument is a big array (issue 33: a host
gets the bytes once, whatever its number of ranks): a 4-rank call spread over the 2 hosts (2
ranks on each) with an --mb MiB numpy argument, against Ray's own way (`ray.put` once, 4 actors
of one GPU each, SPREAD, read it). A host's bytes are what its link carried toward it (the
tx_bytes of its veth on the bridge side), for that call's driver run less the same driver run
with a one-element argument (so connecting, starting workers and the broker's talk cancel out).
Samples alternate: gpusession, Ray, gpusession, Ray...
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.multihost.hostkill import kill_at_once  # noqa: E402
from tests.multihost.simcluster import SimCluster, can_run, kill_session  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import Row, write  # noqa: E402

DRIVER = str(Path(__file__).resolve().parent / "_multihost_driver.py")


def driver_result(cluster: SimCluster, *args: str, timeout: float) -> dict:
    status, out = cluster.run_python(cluster.head, DRIVER, *args, timeout=timeout)
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if status != 0 or not results:
        raise SystemExit(f"driver {' '.join(args)} failed (exit status {status}); output:\n{out[-5000:]}")
    return json.loads(results[-1][len("RESULT "):])


def calls(cluster: SimCluster, repeats: int, fits: int, firsts: int, setup: str) -> list[Row]:
    out = driver_result(cluster, "calls", str(repeats), str(fits), timeout=900)
    gs, rt = out["gpusession"], out["ray_train"]
    first_gs, first_rt = [], []
    # first calls of new drivers once the cluster ran calls; the first side flipped each round
    for round_ in range(firsts):
        for side in ("ray_train", "gpusession")[::1 if round_ % 2 == 0 else -1]:
            first = driver_result(cluster, "first", side, timeout=600)["first_s"]
            (first_gs if side == "gpusession" else first_rt).append(first)
    print(f"first calls of new drivers: gpusession {', '.join(f'{t:.2f}' for t in first_gs)} s; Ray Train "
          f"{', '.join(f'{t:.2f}' for t in first_rt)} s", flush=True)
    print(f"@gs.distributed(gpus=4, placement='spread'): first {gs['first_s']:.2f} s, repeats "
          f"{', '.join(f'{t:.2f}' for t in gs['repeat_s'])} s; nodes {gs['nodes']}")
    print(f"TorchTrainer.fit(), 4 workers SPREAD: first {rt['first_s']:.2f} s, repeats "
          f"{', '.join(f'{t:.2f}' for t in rt['repeat_s'])} s", flush=True)
    configured = (f"{setup}; all-reduce of one tensor over 4 gloo ranks spread over 2 hosts, from a driver on the "
                  "head; Ray Train ScalingConfig(num_workers=4, use_gpu=True, placement_strategy='SPREAD')")
    pool = out.get("ray_pool")
    rows = [Row("4-rank spread call, the cluster's first call (its hosts' workers start), from a new driver", "s",
                [gs["first_s"]], "Ray Train first fit()", [rt["first_s"]], configured,
                samples_note="one a cluster: a sample is a fresh simulated cluster, over a minute to start"),
            Row("4-rank spread call, first call of a new driver once the cluster ran calls", "s", first_gs,
                "Ray Train first fit() of a new driver", first_rt, configured)]
    if pool:
        print(f"long-lived Ray pool, 4 actors: making it and its first call {pool['first_s']:.2f} s, repeats "
              f"{', '.join(f'{t:.3f}' for t in pool['repeat_s'])} s; nodes {pool['nodes']}", flush=True)
        rows.append(Row("4-rank spread call, repeat calls", "s", gs["repeat_s"],
                        "long-lived pool: holds its GPUs between calls", pool["repeat_s"],
                        f"{configured}; pool: 4 Ray actors (num_gpus=1) with a gloo group formed once, one method "
                        "call per call (benchmarks/_ray_pool.py); gpusession: a lease, 4 forked ranks, a new "
                        "process group and a release per call", "<= 1 s (SPEC)"))
    if rt["repeat_s"]:
        rows.append(Row("4-rank spread call, repeat calls", "s", gs["repeat_s"],
                        "Ray Train repeat fit(): a new trainer per call", rt["repeat_s"], configured, "<= 1 s (SPEC)"))
    return rows


def link_bytes_in(host) -> int:
    """What the host's link has carried toward it so far (its veth's bridge end sends to it)."""
    return int(Path(f"/sys/class/net/{host.veth}/statistics/tx_bytes").read_text())


def bytes_per_host(cluster: SimCluster, mode: str, mb: int) -> tuple[dict[str, float], dict]:
    """(MB into each worker host for one driver run of `mode` with an mb MiB argument, its result)"""
    before = {h.name: link_bytes_in(h) for h in cluster.workers}
    result = driver_result(cluster, mode, str(mb), timeout=600)
    return {h.name: (link_bytes_in(h) - before[h.name]) / 1e6 for h in cluster.workers}, result


def data(cluster: SimCluster, mb: int, tries: int, setup: str) -> list[Row]:
    ours: list[float] = []
    theirs: list[float] = []
    seconds: dict[str, list[float]] = {"data-gpusession": [], "data-ray": []}
    for attempt in range(1, tries + 1):
        for mode, samples in (("data-gpusession", ours), ("data-ray", theirs)):
            baseline, _ = bytes_per_host(cluster, mode, 0)
            loaded, result = bytes_per_host(cluster, mode, mb)
            hosts = sorted({host for host, _ in result["seen"]})
            if len(hosts) != 2 or len({value for _, value in result["seen"]}) != 1:
                raise SystemExit(f"{mode}: the 4 readers did not all see the argument on both hosts: {result['seen']}")
            per_host = {name: loaded[name] - baseline[name] for name in loaded}
            samples.extend(per_host.values())
            seconds[mode].append(result["seconds"])
            print(f"{mode} try {attempt}: {mb} MiB argument, MB into each host "
                  f"{ {k: round(v, 1) for k, v in per_host.items()} } (call {result['seconds']:.2f} s, "
                  f"readers on {hosts})", flush=True)
    size_mb = mb * 2**20 / 1e6
    configured = (f"{setup}; a {size_mb:.0f} MB float64 numpy argument read by 4 ranks, 2 on each host; "
                  "gpusession: @gs.distributed(gpus=4, placement='spread'); Ray: ray.put once, 4 actors "
                  "(num_gpus=1, SPREAD) each ray.get it; bytes = the host's veth toward it, less a run "
                  "with a one-element argument")
    return [Row(f"{size_mb:.0f} MB argument, 2 ranks on each of 2 hosts: MB that reach each host", "MB", ours,
                "ray.put once + 4 long-lived actors reading it", theirs, configured,
                f"about one copy per host ({size_mb:.0f} MB; issue 33)"),
            Row(f"{size_mb:.0f} MB argument, 2 ranks on each of 2 hosts: call-to-result", "s", seconds["data-gpusession"],
                "ray.put once + 4 long-lived actors reading it", seconds["data-ray"],
                f"{configured}; gpusession's call leases 4 GPUs, forks 4 ranks, forms their process group and "
                "releases; Ray's actors are started before the clock starts and hold their GPUs (shown as it is)")]


def node_loss(cluster: SimCluster, how: str, tries: int, setup: str) -> list[Row]:
    ours, theirs = [], []
    for attempt in range(1, tries + 1):
        ours.append(gpusession_node_loss(cluster, how, attempt))
        theirs.append(ray_train_node_loss(cluster, how, attempt, max_failures=0))
    return [loss_row(f"host lost by {how} under a 4-rank run -> the caller hears of it", ours, theirs,
                     f"{setup}; Ray Train FailureConfig(max_failures=0): it errs once Ray declares the host dead")]


def move(cluster: SimCluster, tries: int, setup: str) -> list[Row]:
    ours, theirs = [], []
    for attempt in range(1, tries + 1):
        ours.append(gpusession_move(cluster, attempt))
        theirs.append(ray_train_node_loss(cluster, "kill", attempt, workers=2, max_failures=1))
    return [loss_row("2-rank run, host without rank 0 killed -> next step on the host that remains", ours, theirs,
                     f"{setup}; checkpoint every step on both; Ray Train FailureConfig(max_failures=1)")]


def loss_row(measure: str, ours: list[float], theirs: list[tuple[float, bool]], configured: str) -> Row:
    reacted = [seconds for seconds, heard in theirs if heard]
    text = "" if len(reacted) == len(theirs) else (
        f"no reaction within {max(s for s, _ in theirs):.0f} s in {len(theirs) - len(reacted)} of {len(theirs)}")
    print(f"{measure}: gpusession {ours} s; Ray Train {[round(s, 2) for s, _ in theirs]} s"
          + (f" ({text})" if text else ""), flush=True)
    return Row(measure, "s", ours, "Ray Train TorchTrainer", reacted, configured, alternative_text=text)


def gpusession_move(cluster: SimCluster, attempt: int) -> float:
    marker = cluster.base / f"moving-{attempt}"
    proc = cluster.python(cluster.head, DRIVER, "move", str(marker))
    _wait_marker(proc, marker, lambda: _finish(proc, timeout=60), cluster)
    victim, lost_at = lose(cluster, "kill", json.loads(marker.read_text())["host"])
    out = _finish(proc, timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"driver failed (exit status {proc.returncode}); output:\n{out[-5000:]}")
    r = json.loads(lines[-1][len("RESULT "):])
    restore(cluster, victim, "gpusession")
    if r.get("next_step") is None:
        raise SystemExit(f"the run did not go on after the host was lost: {r.get('error_type')}: {r.get('error')}")
    told = r["transitions"][0][0] - lost_at if r["transitions"] else float("nan")
    print(f"--- gpusession, host {victim.name} ({victim.ip}) killed under a 2-rank run: restart told after "
          f"{told:.2f} s, next step after {r['next_step'] - lost_at:.2f} s; {r['run_info']}; "
          f"line: {r['transitions'][0][1] if r['transitions'] else None!r}", flush=True)
    return r["next_step"] - lost_at


def restore(cluster: SimCluster, victim, side: str) -> None:
    """The lost host back before the next try, for either side: its Ray node restarted (a node Ray
    declared dead never rejoins under its old id; cut or killed, the host gets a fresh raylet) and
    Ray showing all 4 GPUs alive and free again. A try that started short of 4 GPUs would measure
    a run that never got going, not the loss."""
    DEATHS.setdefault(id(cluster), Deaths(cluster)).after_try(victim, side)
    started = time.monotonic()
    cluster.restart_host(victim)  # on new ports: see restart_host
    gpus = sum(h.gpus for h in cluster.workers)
    r = driver_result(cluster, "whole", str(gpus), "180", timeout=300)
    if not r["whole"]:
        raise SystemExit(f"{victim.name} restarted, but Ray shows {r['total']:g} GPUs alive, {r['free']:g} free "
                         f"(not {gpus}) after {r['waited_s']:.0f} s; nodes {r['nodes']}\n{cluster.head_report()}")
    print(f"    ({victim.name} restarted; Ray shows {gpus} GPUs alive and free "
          f"{time.monotonic() - started:.0f} s after the restart began)", flush=True)


def lose(cluster: SimCluster, how: str, rank0_host: str):
    victim = next(h for h in cluster.workers if h.name != rank0_host)
    lost_at = time.time()
    kill_at_once(victim.netns) if how == "kill" else cluster.cut_link(victim)
    return victim, lost_at


def ray_train_node_loss(cluster: SimCluster, how: str, attempt: int, watch_s: float = 180.0,
                        workers: int = 4, max_failures: int = 0) -> tuple[float, bool]:
    """(seconds from the loss until the driver heard of it, whether it did within watch_s)"""
    marker = cluster.base / f"raytrain-running-{how}-{workers}-{attempt}"  # per loss: an old one would start it at once
    proc = cluster.python(cluster.head, DRIVER, "node-loss-raytrain", str(marker), str(workers), str(max_failures))
    output: list[str] = []  # read as it comes: Ray Train is chatty, and a full pipe would stall it
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    _wait_marker(proc, marker, lambda: (reader.join(10), "".join(output))[1], cluster)
    victim, lost_at = lose(cluster, how, json.loads(marker.read_text())["host"])
    restarted = Path(str(marker) + ".restarted")
    deadline = time.monotonic() + watch_s
    while proc.poll() is None and not restarted.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    heard = time.time()
    if restarted.exists():
        what = "restarted (its first step done)"
        heard = json.loads(restarted.read_text())["time"]
    elif proc.poll() is not None:
        reader.join(10)
        lines = [line for line in output if line.startswith("RESULT ")]
        r = json.loads(lines[-1][len("RESULT "):]) if lines else {}
        heard = r.get("error_time", heard)
        what = f"error {r.get('error_type')}: {r.get('error', '')[:300]!r}"
    else:
        what = f"nothing within {watch_s:.0f} s"
    kill_session(proc)
    print(f"--- Ray Train, {workers} workers, host {victim.name} ({victim.ip}) lost by {how}: {what} after "
          f"{heard - lost_at:.1f} s", flush=True)
    restore(cluster, victim, "Ray Train")
    return heard - lost_at, not what.startswith("nothing")


def _finish(proc, timeout: float) -> str:
    """The driver's output once it ended; if it has not within timeout, stop it and say what it printed."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_session(proc)
        raise SystemExit(f"the driver did not end within {timeout:.0f} s; it printed:\n{proc.communicate()[0][-5000:]}")


def _wait_marker(proc, marker: Path, printed, cluster: SimCluster) -> None:
    """Until the run's rank 0 wrote the marker (it is running); printed() is the driver's output,
    shown when the run ended or did not get going within 300 s, with Ray's view of the nodes."""
    deadline = time.monotonic() + 300
    while not marker.exists() or not marker.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_session(proc)
            raise SystemExit(f"the run never got going; driver output:\n{printed()[-3000:]}\n{node_deaths(cluster)}")
        time.sleep(0.1)


def node_deaths(cluster: SimCluster) -> str:
    """What the head's GCS said about nodes' registrations and deaths, and the nodes Ray shows
    now: a healthy host declared dead (a health check too tight for a loaded machine) shows here."""
    status, out = cluster.run_python(cluster.head, DRIVER, "whole", "4", "0", timeout=120)
    now = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return ("the head's GCS on nodes:\n" + "\n".join(line[:300] for line in gcs_node_lines(cluster)[-25:])
            + f"\nRay now: {now[-1] if now else out[-500:]}")


def gcs_node_lines(cluster: SimCluster) -> list[str]:
    """The GCS log's lines on nodes registering, failing health checks and dying (not its stats)."""
    return [line.rstrip() for path in cluster.head.tmp.glob("ray/session_2*/logs/gcs_server.out")
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("[") and re.search(r"gcs_health_check_manager|gcs_node_manager", line)]


DEATH = re.compile(r"death reason = .*node_id=(\w+) node_name=([\d.]+)")  # every death, whatever its reason


class Deaths:
    """Nodes Ray declared dead, from the GCS log: each try should see exactly one, the host it
    lost; any other is a healthy host (or the lost host's restarted node) declared dead, a false
    death, which would leave the next try short of GPUs."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster, self.seen = cluster, 0
        self.false: list[tuple[str, list]] = []

    def all(self) -> list[tuple[str, str]]:
        return [(m.group(1)[:8], m.group(2)) for line in gcs_node_lines(self.cluster) if (m := DEATH.search(line))]

    def after_try(self, victim, side: str, wait_s: float = 150.0) -> None:
        """Wait (up to wait_s) until Ray declared the lost host dead, so that its restart never
        races its old node's death; then say whether any other node died in this try."""
        deadline = time.monotonic() + wait_s
        while not any(address == victim.ip for _, address in self.all()[self.seen:]) and time.monotonic() < deadline:
            time.sleep(0.5)
        deaths = self.all()
        new, self.seen = deaths[self.seen:], len(deaths)
        if len(new) != 1 or new[0][1] != victim.ip:
            print(f"!!! {side}'s try: Ray declared {new or 'no node'} dead; only {victim.name} ({victim.ip}) was lost"
                  + (": a false node death, the health check is too tight for this machine" if len(new) > 1 else ""),
                  flush=True)
            self.false.append((side, new))


DEATHS: dict[int, Deaths] = {}  # id(cluster) -> its deaths


def gpusession_node_loss(cluster: SimCluster, how: str, attempt: int) -> float:
    marker = cluster.base / f"running-{how}-{attempt}"  # per loss: an old one would start it at once
    proc = cluster.python(cluster.head, DRIVER, "node-loss", str(marker))
    deadline = time.monotonic() + 300
    while not marker.exists() or not marker.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the run never got going; driver output:\n{proc.communicate()[0][-5000:]}")
        time.sleep(0.1)
    rank0_host = json.loads(marker.read_text())["host"]
    victim = next(h for h in cluster.workers if h.name != rank0_host)
    survivor = cluster.host(rank0_host)
    lost_at = time.time()
    kill_at_once(victim.netns) if how == "kill" else cluster.cut_link(victim)
    out = _finish(proc, timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"driver failed (exit status {proc.returncode}); output:\n{out[-5000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    report(result, how, lost_at, victim, survivor)
    restore(cluster, victim, "gpusession")
    return result.get("error_time", time.time()) - lost_at


def report(r: dict, how: str, lost_at: float, victim, survivor) -> None:
    def after(t):
        return f"{t - lost_at:.1f} s" if t is not None else "not within the watch"

    def first(pred):
        return next((s["t"] for s in r.get("samples", []) if pred(s)), None)

    blamed = re.search(r"Rank (\d+) on (\S+)", r.get("error", "")) or \
        re.search(r"with (ranks? [\d, ]+)\.", r.get("error", ""))
    message = r.get("error", "")
    names_victim = f"name {victim.name in message}, IP {victim.ip in message}"
    nxt = r["next_request"]
    print(f"--- host {victim.name} ({victim.ip}) lost by {how}; rank 0 on {survivor.name}")
    print(f"error after {after(r.get('error_time'))}: {r.get('error_type')}; blames "
          f"{blamed.group(0).rstrip('.') if blamed else 'no rank'}; mentions the lost host's {names_victim}")
    print(f"  message: {r.get('error', '')[:400]!r}")
    print(f"  run: {r['run_info']}")
    print(f"Ray marks {victim.name} dead: {after(first(lambda s: not s['alive'].get(victim.ip, False)))}; "
          f"survivor's 2 GPUs free in Ray: {after(first(lambda s: s['free'].get(survivor.ip) == 2))}")
    print(f"broker: nothing leased {after(first(lambda s: s['broker_leased'] == 0))}, "
          f"capacity down to 2 GPUs {after(first(lambda s: s['broker_total'] <= 2))}")
    outcome = f"{nxt.get('error_type')}: {nxt.get('error', '')[:300]!r}" if "error_type" in nxt else \
        f"ran, value {nxt.get('value')}"
    print(f"4-GPU request at {after(nxt['asked'])}: ended {nxt['ended'] - nxt['asked']:.1f} s later, {outcome}; "
          f"{nxt['run_info']}")


def health_check_env(seconds: float | None) -> dict:
    """Ray's node health check (GCS, ray_config_def.h): a host is dead after failure_threshold
    checks of period_ms fail (each waits timeout_ms). Default 3 s period, 10 s timeout, 5 failures."""
    if seconds is None:
        return {}
    ms = str(int(seconds * 1000))
    return {"RAY_health_check_period_ms": ms, "RAY_health_check_timeout_ms": ms,
            "RAY_health_check_failure_threshold": str(HEALTH_CHECK_FAILURES), "RAY_health_check_initial_delay_ms": "1000"}


HEALTH_CHECK_FAILURES = 3
# Lower settings tried on this 2-core shared machine, and what went wrong: said in a tuned row
# whose value is above them, so the row states why its value is the lowest that held.
TOO_LOW: dict[float, str] = {}


def health_check_text(seconds: float | None) -> str:
    if seconds is None:
        return "Ray health check default (3 s period, 10 s timeout, 5 failures)"
    failed = [text for value, text in sorted(TOO_LOW.items()) if value < seconds]
    return ("Ray health check tuned: " + ", ".join(f"{k}={v}" for k, v in health_check_env(seconds).items())
            + " (set on every node)" + (f", the lowest that held here ({'; '.join(failed)})" if failed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="only the 4-rank calls")
    parser.add_argument("--repeats", type=int, default=5, help="repeat @gs.distributed calls to time")
    parser.add_argument("--fits", type=int, default=6, help="TorchTrainer.fit() calls to time (first + repeats)")
    parser.add_argument("--firsts", type=int, default=5,
                        help="first calls of new drivers to time on each side once the cluster ran calls "
                             "(one driver process each)")
    parser.add_argument("--node-loss", choices=("kill", "cut"), help="only a host lost under a 4-rank run")
    parser.add_argument("--move", action="store_true", help="only a 2-rank run moving off a killed host")
    parser.add_argument("--data", action="store_true", help="only the bytes a big argument brings to each host")
    parser.add_argument("--mb", type=int, default=400, help="--data: the argument's size in MiB")
    parser.add_argument("--tries", type=int, default=5,
                        help="tries of each loss (the host comes back between) and of the --data calls")
    parser.add_argument("--ray-health-check-s", type=float, help="lower Ray's health-check period and timeout")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a smoke run that must not replace the measured file)")
    args = parser.parse_args()
    reason = can_run()
    if reason:
        raise SystemExit(f"cannot simulate hosts: {reason}")
    everything = not (args.calls or args.node_loss or args.move or args.data)
    started = time.monotonic()
    env = {"GPUSESSION_PG_TIMEOUT_S": "120", **health_check_env(args.ray_health_check_s)}
    setup = ("simulated cluster: head + 2 hosts x 2 logical GPUs in network namespaces; gpusession "
             "GPUSESSION_HOST_SILENCE_S default 5 s; " + health_check_text(args.ray_health_check_s))
    rows: list[Row] = []
    # --data: room in each node's object store for the argument (2x: the caller's copy and a host's)
    store = max(100_000_000, int(2.2 * args.mb * 2**20)) if everything or args.data else 100_000_000
    with SimCluster(hosts=2, gpus_per_host=2, extra_env=env, object_store_bytes=store) as cluster:
        print(f"simulated cluster up in {time.monotonic() - started:.0f} s: head {cluster.head.ip}, "
              + ", ".join(f"{h.name} {h.ip}" for h in cluster.workers), flush=True)
        if everything or args.calls:
            rows += calls(cluster, args.repeats, args.fits, args.firsts, setup)
        for how in ("kill", "cut") if everything else [args.node_loss] if args.node_loss else []:
            rows += node_loss(cluster, how, args.tries, setup)
        if everything or args.move:
            rows += move(cluster, args.tries, setup)
        if everything or args.data:
            rows += data(cluster, args.mb, args.tries, setup)
        false = DEATHS[id(cluster)].false if id(cluster) in DEATHS else []
    if false:  # said in the row: a try after a false death did not start on the whole cluster
        rows = [replace(row, configured=f"{row.configured}; Ray declared a healthy node dead in {len(false)} "
                        "tries of this run") for row in rows]
    if args.ray_health_check_s:
        rows = [replace(row, note="Ray's health check tuned") for row in rows]
    # merge: each part may be run on its own (--node-loss cut, then kill, then --move)
    write("multihost-tuned" if args.ray_health_check_s else "multihost", rows, script="multihost", merge=True,
          folder=Path(args.out) if args.out else None)
    print(f"ratios gpusession / alternative (lower is better; all took {time.monotonic() - started:.0f} s):")
    for row in (r.as_json() for r in rows):
        print(f"  {row['measure']} vs {row['alternative']}: "
              f"{row['ratio'] if row['ratio'] is not None else row['alternative_value']}")


if __name__ == "__main__":
    main()
