"""Samples per second of one DDP script (benchmarks/_scaling_train.py) launched by gpusession
(@gs.distributed, from a driver on the head: benchmarks/_scaling_driver.py) and by torchrun (one
launcher per host, `--nnodes=2 --node_rank=i`, as torchrun's docs set up a multi-node job), on
the same simulated hosts (tests/multihost/simcluster.py: each host a network namespace with a Ray
node of 2 logical GPUs, its link shaped with tc tbf): 1 rank, 2 ranks on one host, 2 ranks on 2
hosts over each shaped link, for a link-bound and a compute-bound model, and both over an
imperfect network (200 Mbit/s, one host's link 20 ms slower each way, and for the compute-bound
model also losing 1 % of its frames each way, through the relay of tests/multihost/linkrelay.py:
the same for both launchers). Then, over the 200 Mbit/s
link with the link-bound model, each gradient compression gpusession applies (its hook,
run/rank/comm_hooks.py) in gpusession's ranks against plain DDP there, with the loss after the same
steps. Needs root.

Both launchers run the same `train` function with the same hook, the same steps and the same
warm-up: one discarded call per launcher before the first sample (gpusession: the nodes' warm
parents and workers start; torchrun: the same imports read from disk once), then in every call
11 untimed steps (PowerSGD all-reduces plainly for its first 10) and the timed steps between two
barriers: as many as make a sample last at least --compute-min-s seconds (5), counted from timed
calibration calls of each launcher before the first round, with a margin (the compute-bound
model's once; the link-bound model's for each configuration, as its pace is the link's; --steps
fixes the link-bound count instead); the same count on every side; each row notes how long its
samples took.
The compute-bound model has a control side as well: torchrun with gpusession's malloc settings
(MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ set as gpusession/run/rank/heap.py sets them in a
rank), so the rows show how much of a difference comes from the launcher and how much from malloc.
Each sample also prints rank 0's share of a CPU over the timed steps, its threads, niceness and
scheduler group: on a shared machine, what a launcher's figure depends on. Samples alternate (gpusession, torchrun, then torchrun, gpusession in the next round),
every configuration once per round; the results file is rewritten after each round.

    sudo .venv/bin/python benchmarks/scaling.py [--samples 3] [--steps N] [--compute-min-s 5] [--budget-s 1200]
    sudo .venv/bin/python benchmarks/scaling.py --only "loss" --merge   # one part, merged into the file
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import math
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import Row, spread, write  # noqa: E402

from gpusession.run.rank.heap import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES  # noqa: E402
from tests.multihost.simcluster import SimCluster, can_run, kill_session  # noqa: E402

SCRIPT = str(ROOT / "benchmarks" / "_scaling_train.py")
DRIVER = str(ROOT / "benchmarks" / "_scaling_driver.py")
WARMUP = 11
PORT = 29555
LINKS_MBIT = (1000, 200)
# An imperfect network: one host's link holds every frame DELAY_MS each way (40 ms more round trip).
# No loss here: with 1 % (tests/shaped/test_lossy_link.py) TCP over that round trip carries a few
# Mbit/s, and one sample of the link-bound model would take minutes.
DELAY_MS, LOSS = 20.0, 0.0
# A lossy network too, for the compute-bound model only: its 0.27 MB of gradients a step still pass
# a link where TCP over that round trip with 1 % of frames lost carries a few Mbit/s, so a sample
# takes under a minute. (On such a link the model is bound by the link, not the CPU.)
COMPUTE_LOSS = 0.01
COMPUTE_MIN_S = 5.0  # a compute-bound sample lasts at least this long (its steps are short)
CALIBRATION_STEPS = 200
LINK_CALIBRATION_STEPS = 5  # a link-bound step takes 0.015-0.7 s: five time the pace well enough
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
GPUSESSION, TORCHRUN, TORCHRUN_MALLOC = "gpusession", "torchrun", "torchrun with gpusession's malloc settings"
# What gpusession/run/rank/heap.py sets in each rank, as the environment variables glibc reads at start
MALLOC_SETTINGS = {"MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES), "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}
CALL_TIMEOUT_S = 600
PLACEMENT_TRIES = 3  # calls of a configuration that land on the wrong number of hosts before giving up
PLACEMENT_PAUSE_S = 2.0


@dataclass(frozen=True)
class Config:
    model: str  # "link" or "compute" (_scaling_train.py)
    where: str  # in words, for the rows
    hosts: int
    ranks: int
    rate_mbit: float | None  # each worker's link; None: the bridge's own speed
    compression: str = "none"
    launchers: tuple = (GPUSESSION, TORCHRUN)
    delay_ms: float = 0.0  # added to the second host's link each way (linkrelay.py), with `loss`
    loss: float = 0.0

    @property
    def placement(self) -> str:
        return "spread" if self.hosts == 2 else "pack"


@dataclass(frozen=True)
class Steps:
    """Timed steps per call: the compute-bound model's, calibrated once; the link-bound model's per
    configuration (its pace is the link's: 0.015 s a step on one host, 0.7 s over the delayed
    link), calibrated, or --steps for every one. A compression configuration takes its plain
    DDP configuration's count (the rows compare them at equal steps)."""

    compute: int
    link: dict  # link-bound Config with compression "none" -> timed steps
    fixed_link: int | None = None  # --steps: the same count everywhere

    def of(self, config: Config) -> int:
        if config.model == "compute":
            return self.compute
        if self.fixed_link is not None:
            return self.fixed_link
        return self.link[plain(config)]


def plain(config: Config) -> Config:
    """The configuration without gradient compression (what a compression row is compared with)."""
    return Config(config.model, config.where, config.hosts, config.ranks, config.rate_mbit,
                  launchers=(GPUSESSION, TORCHRUN), delay_ms=config.delay_ms, loss=config.loss)


def sample_steps(seconds_per_step: float, min_s: float = COMPUTE_MIN_S) -> int:
    """Steps that take at least min_s at the calibrated pace, with half as many again for samples
    that run faster than the calibration did."""
    return max(1, math.ceil(1.5 * min_s / seconds_per_step))


def torchrun(cluster: SimCluster, hosts: list, nproc: int, model: str, compression: str, steps: int,
             warmup: int = WARMUP, malloc: bool = False) -> dict:
    """One run: a launcher on each host; rank 0's RESULT."""
    master = hosts[0].ip
    procs = []
    for node_rank, host in enumerate(hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(hosts)}", f"--nproc_per_node={nproc}",
                f"--node_rank={node_rank}", f"--master_addr={master}", f"--master_port={PORT}",
                SCRIPT, model, compression, str(steps), str(warmup)]
        env = cluster.env(host, GLOO_SOCKET_IFNAME="simnet0", OMP_NUM_THREADS="1", **(MALLOC_SETTINGS if malloc else {}))
        procs.append(cluster.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=CALL_TIMEOUT_S)[0] for proc in procs]
    results = [line for line in outputs[0].splitlines() if line.startswith("RESULT ")]
    if any(proc.returncode for proc in procs) or not results:
        raise SystemExit(f"torchrun {model} {compression} failed:\n" + "\n---\n".join(o[-3000:] for o in outputs))
    return json.loads(results[-1][len("RESULT "):])


class Driver:
    """The gpusession side: one driver process on the head for the whole benchmark, asked for
    one call at a time over its stdin (benchmarks/_scaling_driver.py)."""

    def __init__(self, cluster: SimCluster) -> None:
        head = cluster.head
        self.proc = cluster.popen(head, [sys.executable, DRIVER],
                                  env=cluster.env(head, RAY_ADDRESS=cluster.address),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.tail: list[str] = []  # the driver's last lines, shown if a call fails
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the driver ended

    def call(self, config: Config, steps: int, warmup: int = WARMUP) -> dict:
        """One call's RESULT, on as many hosts as the configuration has. Right after a link's
        relay is added or removed (shape), the broker's 1 s probe of that host's raylet can miss
        it, and a 'spread' lease then goes where the GPUs answer (the likely cause of a run at
        2a22c35 that put both ranks of a 2-host call on one host, right after the lossy link's
        relay went); such a call is run again, at most PLACEMENT_TRIES times, and says so."""
        for attempt in range(1, PLACEMENT_TRIES + 1):
            result = self._call_once(config, steps, warmup)
            if len(result["hosts"]) == config.hosts:
                return result
            print(f"gpusession ran {describe(config)} on hosts {result['hosts']} (try {attempt} of "
                  f"{PLACEMENT_TRIES}): a host's link was settling; its sample is not counted", flush=True)
            time.sleep(PLACEMENT_PAUSE_S)
        raise SystemExit(f"gpusession ran {config} on hosts {result['hosts']} {PLACEMENT_TRIES} times")

    def _call_once(self, config: Config, steps: int, warmup: int) -> dict:
        request = {"gpus": config.ranks, "placement": config.placement, "model": config.model,
                   "compression": config.compression, "steps": steps, "warmup": warmup}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise SystemExit(f"the gpusession driver gave no answer to {request}:\n" + "".join(self.tail[-60:]))
            self.tail = (self.tail + [line])[-200:]
            if line.startswith("FAILED "):
                raise SystemExit(f"gpusession call {request} failed: {line}\n" + "".join(self.tail[-60:]))
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])

    def stop(self) -> None:
        kill_session(self.proc)


def configurations() -> list[Config]:
    configs = []
    for model in ("link", "compute"):
        # the compute-bound model, whose pace malloc's settings move, also gets the malloc control
        launchers = (GPUSESSION, TORCHRUN) + ((TORCHRUN_MALLOC,) if model == "compute" else ())
        configs.append(Config(model, "1 rank", 1, 1, None, launchers=launchers))
        configs.append(Config(model, "2 ranks, 1 host", 1, 2, None, launchers=launchers))
        for rate in LINKS_MBIT:
            configs.append(Config(model, f"2 ranks, 2 hosts, {rate} Mbit/s", 2, 2, rate, launchers=launchers))
        loss = LOSS if model == "link" else COMPUTE_LOSS
        impaired = f"one link +{DELAY_MS:g} ms each way" + (f" and {loss:.1%} loss" if loss else "")
        configs.append(Config(model, f"2 ranks, 2 hosts, 200 Mbit/s, {impaired}", 2, 2, 200,
                              launchers=launchers, delay_ms=DELAY_MS, loss=loss))
    for compression in COMPRESSIONS[1:]:  # gpusession's own option against gpusession's plain DDP
        configs.append(Config("link", "2 ranks, 2 hosts, 200 Mbit/s", 2, 2, 200, compression, (GPUSESSION,)))
    return configs


def shape(cluster: SimCluster, config: Config | None) -> None:
    for i, host in enumerate(cluster.workers):
        if config is None or config.rate_mbit is None:
            cluster.unshape_link(host)
        elif i == 1 and (config.delay_ms or config.loss):
            cluster.shape_link(host, rate_mbit=config.rate_mbit, delay_ms=config.delay_ms, loss=config.loss)
        else:
            cluster.shape_link(host, rate_mbit=config.rate_mbit)


def run_once(cluster: SimCluster, driver: Driver, launcher: str, config: Config, steps: int,
             warmup: int = WARMUP) -> dict:
    if launcher == GPUSESSION:
        return driver.call(config, steps, warmup)
    one, two = cluster.workers
    hosts = [one, two] if config.hosts == 2 else [one]
    return torchrun(cluster, hosts, config.ranks // config.hosts, config.model, config.compression, steps, warmup,
                    malloc=launcher == TORCHRUN_MALLOC)


def calibrate_link(cluster: SimCluster, driver: Driver, min_s: float, only: str | None = None) -> dict:
    """Each link-bound configuration's timed steps for a sample of at least min_s: one timed call
    of LINK_CALIBRATION_STEPS per launcher over that configuration's link, the faster pace of the
    two counted, as for the compute-bound model."""
    counts = {}
    for config in configurations():
        if config.model != "link" or config.compression != "none":
            continue
        if only is not None and not any(only in describe(c) for c in configurations() if plain(c) == config):
            continue
        shape(cluster, config)
        took = {launcher: run_once(cluster, driver, launcher, config, LINK_CALIBRATION_STEPS)["seconds"]
                for launcher in (GPUSESSION, TORCHRUN)}
        counts[config] = sample_steps(min(took.values()) / LINK_CALIBRATION_STEPS, min_s)
        print(f"calibration: {LINK_CALIBRATION_STEPS} link-bound steps, {config.where}, took "
              f"{', '.join(f'{s:.2f} s ({launcher})' for launcher, s in took.items())}; {counts[config]} timed "
              f"steps a sample (>= {min_s:g} s)", flush=True)
    shape(cluster, None)
    return counts


def calibrate(cluster: SimCluster, driver: Driver, min_s: float) -> int:
    """The compute-bound model's timed steps for a sample of at least min_s: one timed call of
    1 rank per launcher (the fastest configuration, so every other one lasts longer), the faster
    pace of the two counted (a first call runs slower than the samples do)."""
    shape(cluster, None)
    config = Config("compute", "calibration", 1, 1, None)
    took = {launcher: run_once(cluster, driver, launcher, config, CALIBRATION_STEPS)["seconds"]
            for launcher in (GPUSESSION, TORCHRUN)}
    steps = sample_steps(min(took.values()) / CALIBRATION_STEPS, min_s)
    print(f"calibration: {CALIBRATION_STEPS} compute-bound steps took "
          f"{', '.join(f'{s:.2f} s ({launcher})' for launcher, s in took.items())}; {steps} timed steps a sample "
          f"(>= {min_s:g} s)", flush=True)
    return steps


def warm_up(cluster: SimCluster, driver: Driver) -> None:
    """One discarded call per launcher, across both hosts (the first gpusession call starts each
    node's warm parent and workers; the first torchrun reads torch from disk)."""
    shape(cluster, None)
    config = Config("compute", "warm-up", 2, 2, None)
    for launcher in (GPUSESSION, TORCHRUN):
        started = time.monotonic()
        run_once(cluster, driver, launcher, config, steps=1, warmup=1)
        print(f"warm-up call, {launcher}: {time.monotonic() - started:.1f} s (discarded)", flush=True)


def measure(cluster: SimCluster, driver: Driver, samples: int, steps: Steps, on_round,
            budget_s: float | None = None, only: str | None = None) -> dict:
    """Up to `samples` rounds; with budget_s, no round is begun that would end after it (by the
    longest round so far), so a shared machine's slow hour still ends with whole rounds. With
    `only`, just the configurations whose description contains it."""
    configs = [c for c in configurations() if only is None or only in describe(c)]
    measured: dict = {(config, launcher): [] for config in configs for launcher in config.launchers}
    started, longest = time.monotonic(), 0.0
    for sample in range(samples):
        if budget_s is not None and time.monotonic() - started + longest > budget_s:
            print(f"stopping after {sample} rounds: another would pass --budget-s {budget_s:g}", flush=True)
            break
        round_started = time.monotonic()
        for config in configs:
            shape(cluster, config)
            order = config.launchers if sample % 2 == 0 else tuple(reversed(config.launchers))
            for launcher in order:
                result = run_once(cluster, driver, launcher, config, steps.of(config))
                measured[(config, launcher)].append(result)
                print(f"round {sample + 1}: {describe(config)}, {launcher}: {result['samples_per_s']:.1f} samples/s, "
                      f"loss {result['loss']:.4f}; {diagnostics(result)}", flush=True)
        on_round(measured, sample + 1)
        longest = max(longest, time.monotonic() - round_started)
    return measured


def describe(config: Config) -> str:
    return f"{config.model}, {config.where}, {config.compression}"


def diagnostics(result: dict) -> str:
    """Rank 0's share of a CPU over the timed steps (its main thread's, its process's), its
    threads, niceness and scheduler group: what differs between launchers when samples/s do."""
    if "cpu_main_s" not in result:
        return ""
    took = result["seconds"]
    return (f"rank 0 CPU/s main {result['cpu_main_s'] / took:.2f}, process {result['cpu_process_s'] / took:.2f}; "
            f"threads {result['threads']} ({result['os_threads']} OS), torch {result['torch_threads']}/"
            f"{result['interop_threads']}, OMP {result['omp_num_threads']}, CPUs {result['cpus_allowed']}, "
            f"nice {result['niceness']}, autogroup {result['autogroup']}"
            + (f"; main thread over the timed steps: {result['minor_faults']} minor faults, "
               f"{result['system_s']:.2f} s in the kernel, {result['involuntary_switches']} involuntary switches"
               if "minor_faults" in result else ""))


def figures(results: list[dict], field: str = "samples_per_s") -> list[float]:
    return [r[field] for r in results]


def rows(measured: dict, steps: Steps) -> list[Row]:
    """Every configuration's gpusession / torchrun row, then the compression rows; a configuration
    not measured yet (a partial run) has none."""
    return launcher_rows(measured, steps) + compression_rows(measured, steps)


def launcher_rows(measured: dict, steps: Steps) -> list[Row]:
    out = []
    configs = configurations()
    for config in configs:
        if config.compression != "none":
            continue
        for alternative in config.launchers[1:]:
            row = launcher_row(measured, steps, configs, config, alternative)
            if row is not None:
                out.append(row)
    return out


def launcher_row(measured: dict, steps: Steps, configs: list[Config], config: Config, alternative: str) -> Row | None:
    """gpusession against one alternative launcher on one configuration; None until both have samples."""
    ours, theirs = measured.get((config, GPUSESSION), []), measured.get((config, alternative), [])
    if not ours or not theirs:
        return None
    note = (f"{len(ours)} samples per side; rank niceness gpusession {ours[-1].get('niceness')}, "
            f"torchrun {theirs[-1].get('niceness')}")
    if config.ranks == 2:
        single = next(c for c in configs if c.model == config.model and c.ranks == 1)
        singles = {side: figures(measured.get((single, side), [])) for side in (GPUSESSION, alternative)}
        if all(singles.values()):
            ideal = {side: 2 * statistics.median(values) for side, values in singles.items()}
            note += (f"; scaling efficiency (samples/s / 2 x 1 rank's): gpusession "
                     f"{statistics.median(figures(ours)) / ideal[GPUSESSION]:.2f}, torchrun "
                     f"{statistics.median(figures(theirs)) / ideal[alternative]:.2f}")
    seconds = statistics.median(figures(ours + theirs, "seconds")) if "seconds" in ours[0] else None
    if seconds is not None:
        note += f"; a sample's timed steps took {seconds:.1f} s (median)"
    malloc = (f" with gpusession's malloc settings ({', '.join(f'{k}={v}' for k, v in MALLOC_SETTINGS.items())})"
              if alternative == TORCHRUN_MALLOC else "")
    return Row(measure=f"{config.model}-bound model, {config.where}: samples/s"
                       + (" (control: torchrun with gpusession's malloc settings)" if malloc else ""),
               unit="samples/s", gpusession_samples=figures(ours),
               alternative=f"torchrun, one launcher per host{malloc}", alternative_samples=figures(theirs),
               configured=f"the same DDP script and hook (plain DDP), {WARMUP} warm-up and {steps.of(config)} "
                          "timed steps, gloo on CPU, 1 thread a rank; gpusession from a driver on the head, "
                          f"placement='{config.placement}'", goal=">= 0.97", note=note)


def compression_rows(measured: dict, steps: Steps) -> list[Row]:
    out = []
    configs = configurations()
    plain = next(c for c in configs if c.model == "link" and c.rate_mbit == 200 and c.compression == "none"
                 and not c.delay_ms and not c.loss)
    base = measured.get((plain, GPUSESSION), [])
    for config in configs:
        results = measured.get((config, GPUSESSION), []) if config.compression != "none" else []
        if not results or not base:
            continue
        out.append(Row(measure=f"link-bound model, 2 hosts at 200 Mbit/s: grad_compression={config.compression}",
                       unit="samples/s", gpusession_samples=figures(results),
                       alternative="plain DDP (fp32 all-reduce, DDP's default buckets)",
                       alternative_samples=figures(base),
                       configured=f"gpusession's {config.compression} hook vs DDP's built-in all-reduce, both "
                                  f"launched by gpusession, {WARMUP} warm-up steps then {steps.of(config)} timed",
                       goal=">= 3" if config.compression == "powersgd" else ">= 1.6",
                       note=f"loss after {WARMUP + steps.of(config)} steps {statistics.median(figures(results, 'loss')):.4f} "
                            f"vs plain {statistics.median(figures(base, 'loss')):.4f}; all-reduced per step per "
                            f"rank {results[-1]['bytes_per_step'] / 1e6:.3g} MB (fp32 gradients: "
                            f"{results[-1]['fp32_grad_bytes'] / 1e6:.3g} MB)"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--steps", type=int, help="timed steps of the link-bound model per sample, the same in "
                                                       "every configuration (default: calibrated per configuration)")
    parser.add_argument("--compute-min-s", type=float, default=COMPUTE_MIN_S,
                        help="a sample's timed steps last at least this many seconds (calibrated), both models")
    parser.add_argument("--budget-s", type=float, help="begin no round that would end after this many seconds")
    parser.add_argument("--only", help="just the configurations whose description (as printed) contains this; "
                                       "no results file is written (to look into one configuration) unless --merge")
    parser.add_argument("--merge", action="store_true",
                        help="with --only: write the rows measured into the results file, keeping its other rows "
                             "(each row keeps the machine and command it was measured with)")
    args = parser.parse_args()
    if args.merge and not args.only:
        parser.error("--merge goes with --only (a full run rewrites the whole results file)")
    reason = can_run()
    if reason:
        raise SystemExit(reason)
    loadavg_before = os.getloadavg()
    cluster = SimCluster(hosts=2, gpus_per_host=2, extra_env={"GPUSESSION_PG_TIMEOUT_S": "120"})
    driver = None
    steps = Steps(0, {}, args.steps)

    def on_round(measured: dict, done: int) -> None:
        if args.only and not args.merge:
            return
        path = write("scaling", rows(measured, steps), loadavg_before=loadavg_before, merge=args.merge)
        print(f"round {done} of {args.samples} written to {path}", flush=True)

    try:
        cluster.start()
        driver = Driver(cluster)
        warm_up(cluster, driver)
        link = {} if args.steps is not None else calibrate_link(cluster, driver, args.compute_min_s, args.only)
        steps = Steps(calibrate(cluster, driver, args.compute_min_s), link, args.steps)
        measured = measure(cluster, driver, args.samples, steps, on_round, args.budget_s, args.only)
    finally:
        if driver is not None:
            driver.stop()
        cluster.stop()
    final = rows(measured, steps)
    for row in final:
        shown = row.as_json()
        print(f"{row.measure}: {spread(row.gpusession_samples)} vs {spread(row.alternative_samples)} "
              f"({row.note}), ratio {shown['ratio']} (goal {row.goal})")
    launcher_ratios = [r.as_json()["ratio"] for r in final if r.alternative.startswith("torchrun")]
    print(f"ratio {min(launcher_ratios):.3f} (the lowest of gpusession / torchrun samples/s over every configuration)")


if __name__ == "__main__":
    main()
