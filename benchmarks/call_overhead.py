"""Call-to-result of a trivial 2-worker allreduce: @gs.distributed on a warm cluster vs two Ray
baselines (gloo, the same logical GPUs): a long-lived pool of actors that holds its GPUs and its
process group between calls (benchmarks/_ray_pool.py), and Ray Train's TorchTrainer.fit(), a new
trainer per call; and the first call of a new Python process vs `torchrun` cold on the same
function, measured side by side in one run. The same calls through the gateway (issue 28: a
hub kernel holds no Ray; the service hosts the run), from a process that reaches the cluster
only through it (benchmarks/_gateway_side.py), are set beside the direct ones.

    .venv/bin/python benchmarks/call_overhead.py [--rounds 5] [--calls 5] [--cold 6]

Every side reserves 2 GPUs, runs 2 ranks with a gloo process group, all-reduces one tensor and
returns. Every call of gpusession leases 2 GPUs, forks 2 fresh rank processes from the node's
warm parent (torch already imported), forms their process group and releases the GPUs at the end;
its phases (lease, placement, fork, rendezvous, function, return, release) are printed and kept.
The Ray pool pays none of that per call: it is the price of fresh processes, a lease and a release
per call, shown as it is. Ray Train starts a trainer, a controller and fresh workers on every
fit(). A new process's first call takes spare worker actors from the node host, so it starts no
process of its own (nodehost.py). Warm-up alike: each side's first call is discarded; in each
round gpusession, gateway and pool calls alternate (which goes first flips each time), then one
fit(); first calls of new processes and torchrun runs alternate the same way, and both of those
are timed from outside as whole subprocesses, so load
from elsewhere falls on every side alike. The cluster has 6 logical GPUs: the pool holds 2 all
along, and each other side takes 2 while it runs.
Writes benchmarks/results/call_overhead.json. Goals: warm median <= 0.2 s (SPEC, a quiet machine);
a new process's first call no slower than torchrun cold (ratio <= 1.0, printed last).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _call_phases import PHASES, PhaseClock, phases, timed_body  # noqa: E402
from _cluster import in_turn, local_cluster, median, timed  # noqa: E402
from _gateway_side import FIRST_CALL, GatewaySide  # noqa: E402
from _results import Row, spread, write  # noqa: E402

CLUSTER_GPUS = 6  # the pool's 2, held all along, and 2 for whichever other side runs
POOL = "long-lived pool: holds its GPUs between calls"
TRAINER = "Ray Train TorchTrainer.fit(): a new trainer per call"


def _allreduce():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def gpusession_call(kept_phases: list):
    """The warm @gs.distributed call (connects, and starts the broker and node host on first use);
    each call's phases go to kept_phases (return_all: every rank says when it forked, entered and
    left the function; nothing is printed)."""
    import gpusession as gs

    clock = PhaseClock()
    allreduce = gs.distributed(gpus=2, return_all=True)(timed_body(_allreduce))

    def call():
        value, marks = clock.call(allreduce)
        if value != 2.0:
            sys.exit("wrong result")
        kept_phases.append(phases(marks))

    return call


def ray_pool_call():
    """The long-lived pool: 2 actors with a GPU each and their gloo group, formed once here."""
    from _ray_pool import RayPool

    pool = RayPool(2)

    def call():
        if pool.run(_pool_allreduce) != [2.0, 2.0]:
            sys.exit("wrong result")

    return call, pool


def _pool_allreduce(rank: int, world_size: int) -> float:
    return _allreduce()


def ray_train_fit(storage: str):
    """Ray Train's TorchTrainer as its docs show for 2 GPU workers (gloo here: logical GPUs on CPU),
    its runs' records in STORAGE."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def train_loop():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)

    def fit():
        trainer = TorchTrainer(
            train_loop,
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0}),
            run_config=RunConfig(storage_path=storage),
        )
        trainer.fit()

    return fit


def warm_calls_and_fits(rounds: int, calls_per_round: int, gateway: GatewaySide) -> dict:
    """Warm-up alike: each side's first call is timed apart and discarded (gpusession's starts the
    broker and node host; the pool's first run; Ray Train's imports and its controller code). Then
    rounds: `calls_per_round` gpusession calls alternated with as many calls through the gateway
    and as many pool calls, then one fit()."""
    kept_phases: list = []
    storage = tempfile.mkdtemp(prefix="raytrain-bench-")
    call, (pool_call, pool), fit = gpusession_call(kept_phases), ray_pool_call(), ray_train_fit(storage)
    try:
        first = timed(call, 1)[0]
        gateway.call()
        pool_call()
        fit()
        kept_phases.clear()
        calls, gateway_calls, pool_calls, fits = [], [], [], []
        for round_ in range(rounds):
            for i in range(calls_per_round):
                in_turn(round_ * calls_per_round + i, lambda: calls.extend(timed(call, 1)),
                        lambda: gateway_calls.append(gateway.call()), lambda: pool_calls.extend(timed(pool_call, 1)))
            fits += timed(fit, 1)
    finally:
        pool.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    return {"first": first, "calls": calls, "gateway": gateway_calls, "pool": pool_calls, "fits": fits,
            "phases": kept_phases}


def phase_medians(kept_phases: list) -> dict[str, float]:
    return {name: round(median([p[name] for p in kept_phases]), 4) for name in PHASES}


_TORCHRUN_SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == 2.0
dist.destroy_process_group()
"""


def first_call_seconds() -> float:
    """A new Python process (a fresh kernel) that joins the running cluster and calls once:
    interpreter start, import, connect, lease, start ranks, result. Timed from outside as a whole
    subprocess, exactly as torchrun is."""
    import subprocess

    import ray

    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    command = [sys.executable, "-c", FIRST_CALL]
    return timed(lambda: subprocess.run(command, env=env, capture_output=True, check=True, timeout=300), 1)[0]


def torchrun_cold_seconds(folder: str) -> float:
    """torchrun as its docs show, in a FOLDER of the benchmark's: the script, and (its TMPDIR) the
    log folder torchrun makes by default (torchelastic_*), both removed with the folder."""
    import subprocess

    script = os.path.join(folder, "allreduce.py")
    with open(script, "w") as f:
        f.write(_TORCHRUN_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script]
    env = dict(os.environ, TMPDIR=folder)
    return timed(lambda: subprocess.run(command, check=True, capture_output=True, timeout=300, env=env), 1)[0]


def first_calls_and_torchrun(runs: int, gateway: GatewaySide) -> tuple[list[float], list[float], list[float]]:
    """Alternating, so a burst of load from elsewhere does not fall on one side only."""
    firsts, torchruns, through_gateway = [], [], []
    folder = tempfile.mkdtemp(prefix="torchrun-cold-")
    try:
        for i in range(runs):
            in_turn(i, lambda: firsts.append(first_call_seconds()),
                    lambda: through_gateway.append(gateway.first_call_seconds()),
                    lambda: torchruns.append(torchrun_cold_seconds(folder)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return firsts, torchruns, through_gateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of warm calls alternated with one fit()")
    parser.add_argument("--calls", type=int, default=5, help="warm @gs.distributed calls per round")
    parser.add_argument("--cold", type=int, default=6, help="first calls of new processes, and torchrun runs")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a smoke run that must not replace the measured file)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with local_cluster(gpus=CLUSTER_GPUS):
        import ray

        from gpusession.broker import client

        client.broker()  # made here, so the gateway host finds its ledger and secrets
        gateway = GatewaySide(ray.get_runtime_context().gcs_address, client.ledger_path_here())
        try:
            warm = warm_calls_and_fits(args.rounds, args.calls, gateway)
            first_times, torchrun_times, gateway_firsts = first_calls_and_torchrun(args.cold, gateway)
        finally:
            gateway.stop()
    gs_times, pool_times, rt_times, gateway_times = warm["calls"], warm["pool"], warm["fits"], warm["gateway"]
    call_phases = phase_medians(warm["phases"])
    phase_text = ", ".join(f"{name} {seconds:.3f}" for name, seconds in call_phases.items())
    print(f"machine load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores (at the start: {load_before[0]:.1f})")
    print(f"first call on a fresh cluster (starts the broker and the node host; discarded): {warm['first']:.2f} s")
    print(f"@gs.distributed(gpus=2), warm: {spread(gs_times)} s")
    print(f"  its phases, median s: {phase_text}")
    print(f"the same call through the gateway, warm (a process without Ray): {spread(gateway_times)} s")
    print(f"{POOL}, 2 actors: {spread(pool_times)} s")
    print(f"TorchTrainer.fit(), 2 workers, after one discarded fit(): {spread(rt_times)} s")
    print(f"first call of a new process, whole subprocess: {spread(first_times)} s")
    print(f"first call of a new process through the gateway, whole subprocess: {spread(gateway_firsts)} s")
    print(f"torchrun cold, whole subprocess, alternating with those: {spread(torchrun_times)} s")
    configured = ("all: 2 logical GPUs, gloo, one all_reduce, return_all on gpusession (each rank's phase "
                  "times); each side's first call discarded as warm-up; per round "
                  f"{args.calls} gpusession calls alternated with {args.calls} pool calls (the first flipped each "
                  "time), then one fit(), "
                  f"{args.rounds} rounds")
    note = f"gpusession's phases, median s: {phase_text}"
    rows = [
        Row("warm call: call-to-result of a 2-rank allreduce on a running cluster", "s", gs_times,
            POOL, pool_times,
            f"{configured}; pool: 2 Ray actors (num_gpus=1, max_restarts=-1) with a torch process group formed "
            "once, one method call per call (benchmarks/_ray_pool.py); gpusession: a lease, 2 forked ranks, a "
            "new process group and a release per call", "<= 0.2 s (SPEC)", note=note,
            goal_note="the release is the largest phase (see the note): it waits, bounded, until Ray's own view "
                      "shows the lease's GPUs free before the broker hears of the end, so no other lease is "
                      "placed on them first, and Ray refreshes that view on its raylets' report period; for the "
                      "same call from a process without Ray, see 'warm call through the gateway'"),
        Row("warm call: call-to-result of a 2-rank allreduce on a running cluster", "s", gs_times,
            TRAINER, rt_times,
            f"{configured}; Ray Train as its docs show (ScalingConfig(num_workers=2, use_gpu=True), "
            "TorchConfig(backend='gloo'))", "<= 0.10"),
        Row("first call of a new process (interpreter, import, connect, lease, 2 ranks), whole subprocess", "s",
            first_times, "torchrun --standalone --nproc-per-node=2, cold", torchrun_times,
            "both timed from outside as a whole subprocess, alternated, no warm-up on either side; gpusession "
            "joins the running cluster (its node host already started)", "<= 1.0",
            goal_note="a new process that calls directly joins Ray as a driver (imports Ray, connects to the "
                      "cluster), which torchrun never does; a kernel behind the hub or `gpusession lab` calls "
                      "through the gateway instead: see 'first call of a new process through the gateway'"),
    ]
    gateway_setup = ("a gateway host (gpusession.gateway.hosted.serve_run behind a GatewayServer, a Ray driver "
                     "of the same cluster, as the hub's gateway process is) and a caller with GPUSESSION_GATEWAY "
                     "set and no Ray address, which imports no Ray; the direct side is this commit's own "
                     "@gs.distributed in a Ray driver, not the commit before the gateway")
    rows += [
        Row("warm call through the gateway: call-to-result of a 2-rank allreduce", "s", gateway_times,
            "the same call made directly (a Ray driver)", gs_times,
            f"{configured}; each gateway call alternated with a direct one; {gateway_setup}", "<= 1.15 (issue 28)"),
        Row("first call of a new process through the gateway, whole subprocess", "s", gateway_firsts,
            "first call of a new process made directly (joins Ray)", first_times,
            f"both timed from outside as a whole subprocess, alternated; {gateway_setup}", "<= 1.0 (issue 28)"),
    ]
    write("call_overhead", rows, loadavg_before=load_before, details={"phases": warm["phases"]},
          folder=Path(args.out) if args.out else None)
    print(f"ratio gpusession/{POOL}, warm call: {median(gs_times) / median(pool_times):.3g} (shown as it is)")
    print(f"ratio gpusession/ray_train (a new trainer per call), warm call: {median(gs_times) / median(rt_times):.4f} "
          "(target <= 0.10)")
    print(f"ratio through the gateway / direct, warm call: {median(gateway_times) / median(gs_times):.3f} "
          "(target <= 1.15)")
    print(f"ratio through the gateway / direct, first call of a new process: "
          f"{median(gateway_firsts) / median(first_times):.3f} (target <= 1.0)")
    print(f"ratio first call of a new process / torchrun cold: {median(first_times) / median(torchrun_times):.2f} "
          "(target <= 1.0)")


if __name__ == "__main__":
    main()
