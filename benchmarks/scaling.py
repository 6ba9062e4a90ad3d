"""Samples per second of one DDP script (benchmarks/_scaling_train.py) at 1 rank, 2 ranks on one
host and 2 ranks on 2 hosts over shaped links (tests/multihost/simcluster.py: each host a network
namespace, its link shaped with tc tbf), for a link-bound and a compute-bound model; then, over
the 200 Mbit/s link with the link-bound model, each gradient compression gpusession applies (its
hook, run/comm_hooks.py) against plain DDP, with the loss after the same steps. Needs root.

Every configuration runs under torchrun, one launcher per host (`--nnodes=2 --node_rank=i`), as
torchrun's docs set up a multi-node job; samples are alternated between configurations, each
with the same warm-up steps (11: PowerSGD all-reduces plainly for its first 10). The gpusession
launcher itself (@gs.distributed over Ray) is not in these figures: see the README.

    sudo .venv/bin/python benchmarks/scaling.py [--samples 3] [--steps 5]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.multihost.simcluster import SimCluster, can_run  # noqa: E402

SCRIPT = str(ROOT / "benchmarks" / "_scaling_train.py")
WARMUP = 11
PORT = 29555
LINKS_MBIT = (1000, 200)
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


def torchrun(cluster: SimCluster, hosts: list, nproc: int, model: str, compression: str, steps: int) -> dict:
    """One run: a launcher on each host; rank 0's RESULT."""
    master = hosts[0].ip
    procs = []
    for node_rank, host in enumerate(hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(hosts)}", f"--nproc_per_node={nproc}",
                f"--node_rank={node_rank}", f"--master_addr={master}", f"--master_port={PORT}",
                SCRIPT, model, compression, str(steps), str(WARMUP)]
        env = cluster.env(host, GLOO_SOCKET_IFNAME="simnet0", OMP_NUM_THREADS="1")
        procs.append(cluster.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    results = [line for line in outputs[0].splitlines() if line.startswith("RESULT ")]
    if any(proc.returncode for proc in procs) or not results:
        raise SystemExit(f"torchrun {model} {compression} failed:\n" + "\n---\n".join(o[-3000:] for o in outputs))
    return json.loads(results[-1][len("RESULT "):])


def configurations(cluster: SimCluster) -> dict:
    one, two = cluster.workers
    configs = {}
    for model in ("link", "compute"):
        configs[(model, "1 rank", "none")] = ([one], 1, None)
        configs[(model, "2 ranks, 1 host", "none")] = ([one], 2, None)
        for rate in LINKS_MBIT:
            configs[(model, f"2 ranks, 2 hosts, {rate} Mbit/s", "none")] = ([one, two], 1, rate)
    for compression in COMPRESSIONS[1:]:
        configs[("link", "2 ranks, 2 hosts, 200 Mbit/s", compression)] = ([one, two], 1, 200)
    return configs


def measure(cluster: SimCluster, samples: int, steps: int) -> dict:
    configs = configurations(cluster)
    measured: dict = {key: [] for key in configs}
    for sample in range(samples):  # alternated: every configuration once per round
        for key, (hosts, nproc, rate) in configs.items():
            for host in cluster.workers:
                if rate is None:
                    cluster.unshape_link(host)
                else:
                    cluster.shape_link(host, rate_mbit=rate)
            result = torchrun(cluster, hosts, nproc, key[0], key[2], steps)
            measured[key].append(result)
            print(f"round {sample + 1}: {key}: {result['samples_per_s']:.1f} samples/s, loss {result['loss']:.4f}",
                  flush=True)
    return measured


def median(results: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in results)


def rows(measured: dict) -> list[dict]:
    out = []
    for model in ("link", "compute"):
        single = median(measured[(model, "1 rank", "none")], "samples_per_s")
        for (kind, where, compression), results in measured.items():
            if kind != model or compression != "none" or where == "1 rank":
                continue
            value = median(results, "samples_per_s")
            out.append({"measure": f"{model}-bound model, {where}: scaling efficiency (samples/s / 2 x 1 rank's)",
                        "unit": "samples/s", "gpusession": None,
                        "alternative": "torchrun, one launcher per host, plain DDP", "alternative_value": value,
                        "alternative_samples": [r["samples_per_s"] for r in results],
                        "one_rank_samples_per_s": single, "efficiency": value / (2 * single),
                        "configured": "the gpusession launcher was not measured here (see README)", "ratio": None})
    plain = measured[("link", "2 ranks, 2 hosts, 200 Mbit/s", "none")]
    for compression in COMPRESSIONS[1:]:
        results = measured[("link", "2 ranks, 2 hosts, 200 Mbit/s", compression)]
        value, base = median(results, "samples_per_s"), median(plain, "samples_per_s")
        out.append({"measure": f"link-bound model, 2 hosts at 200 Mbit/s: grad_compression={compression}",
                    "unit": "samples/s", "gpusession": value,
                    "gpusession_samples": [r["samples_per_s"] for r in results],
                    "alternative": "plain DDP (fp32 all-reduce, DDP's default buckets)", "alternative_value": base,
                    "alternative_samples": [r["samples_per_s"] for r in plain],
                    "loss": median(results, "loss"), "alternative_loss": median(plain, "loss"),
                    "bytes_per_step": results[-1]["bytes_per_step"],
                    "configured": f"gpusession's {compression} hook vs DDP's built-in all-reduce, both under "
                                  f"torchrun, {WARMUP} warm-up steps then the timed steps",
                    "ratio": value / base, "goal": ">= 1.6" if compression != "powersgd" else ">= 3"})
    return out


def machine() -> dict:
    import ray
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"cores": os.cpu_count(), "loadavg": list(os.getloadavg()), "python": platform.python_version(),
            "torch": torch.__version__, "ray": ray.__version__, "gpusession_commit": commit.strip(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    reason = can_run()
    if reason:
        raise SystemExit(reason)
    before = machine()
    cluster = SimCluster(hosts=2, gpus_per_host=0)  # network only: torchrun needs no Ray
    try:
        cluster.start(nodes=False)
        measured = measure(cluster, args.samples, args.steps)
    finally:
        cluster.stop()
    result = {"benchmark": "scaling", "command": "python benchmarks/scaling.py", "machine": before,
              "loadavg_after": list(os.getloadavg()), "rows": rows(measured)}
    out = ROOT / "benchmarks" / "results" / "scaling.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["rows"]:
        if row["ratio"] is None:
            print(f"{row['measure']}: {row['alternative_value']:.1f} samples/s, efficiency {row['efficiency']:.2f}")
        else:
            print(f"{row['measure']}: {row['gpusession']:.1f} vs {row['alternative_value']:.1f} samples/s, "
                  f"loss {row['loss']:.4f} vs {row['alternative_loss']:.4f}, ratio {row['ratio']:.2f}")
    last = result["rows"][-1]
    print(f"ratio {last['ratio']:.2f} (powersgd / plain DDP samples/s, 200 Mbit/s, link-bound)")


if __name__ == "__main__":
    main()
