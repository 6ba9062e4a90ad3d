"""Issue 28's goals against the commit before the gateway, side by side in one run: a hub kernel's
warm call, and a fresh kernel's `%load_ext gpusession` plus its first `%%gpu 2` result.

    .venv/bin/python benchmarks/before_gateway.py [--before REV] [--calls 15] [--kernels 5]

Today a hub kernel holds no Ray: it reaches the service's gateway through GPUSESSION_GATEWAY
(a Unix socket) and the gateway, a Ray driver, runs the call. Before the gateway (`--before`,
by default the parent of 5e7d66c, the gateway's first commit), a hub kernel was a Ray driver
itself, given the cluster's RAY_ADDRESS. Each side here has its own cluster of 4 logical GPUs:
- today's: a Ray head in this process, its broker, and a gateway host joined to it
  (benchmarks/_gateway_side.py, as call_overhead.py uses it);
- before's: the commit installed in a venv of its own (benchmarks/_before_side.py), its head and
  broker in a process of its own.

  warm      a long-lived process per side makes the same 2-rank allreduce call each time it is
            told (timed inside it, as call_overhead.py times it); one call each discarded first;
            then `--calls` calls each, the sides alternated, which goes first flipped each time.
  kernel    a new Jupyter kernel per sample (ipykernel, started and ready before the clock
            starts): `%load_ext gpusession`, then a `%%gpu 2` cell that all-reduces a tensor and
            prints it; timed from sending the first cell to the second cell's reply, the
            printed value checked. Sides alternated, which goes first flipped each sample.

Writes benchmarks/results/before_gateway.json. Goals (issue 28): the warm call through the
gateway within 1.15x of the call before; the fresh kernel's first `%%gpu 2` faster than before.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _before_side import BeforeCluster, BeforeInstall, BeforeKernel, commit_of  # noqa: E402
from _cluster import local_cluster  # noqa: E402
from _gateway_side import WARM_LOOP, GatewaySide  # noqa: E402
from _results import Row, spread, write  # noqa: E402

GATEWAY_FIRST_COMMIT = "5e7d66c"
CLUSTER_GPUS = 4
PRINTED = "allreduce 2.0"
CELLS = (
    "%load_ext gpusession",
    "%%gpu 2\nimport torch\nimport torch.distributed as dist\n\nvalue = torch.ones(1)\ndist.all_reduce(value)\n"
    "print('allreduce', value.item())",
)


def fresh_kernel_seconds(python: str, env: dict, cwd: str) -> float:
    """A new kernel of `python`; once it is ready, the seconds from sending `%load_ext gpusession`
    to the reply of the `%%gpu 2` cell."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    specs = tempfile.mkdtemp(prefix="gs-bench-kernelspec-")
    Path(specs, "bench").mkdir()
    Path(specs, "bench", "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bench", "language": "python"}))
    manager = KernelManager(kernel_name="bench", kernel_spec_manager=KernelSpecManager(kernel_dirs=[specs]))
    manager.start_kernel(env=env, cwd=cwd)
    kernel = manager.client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=120)
        streamed: list[str] = []

        def keep(message: dict) -> None:
            if message["msg_type"] == "stream":
                streamed.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                streamed.append("\n".join(message["content"]["traceback"]))

        started = time.perf_counter()
        for code in CELLS:
            reply = kernel.execute_interactive(code, timeout=300, output_hook=keep)
            if reply["content"]["status"] != "ok":
                raise SystemExit(f"{code.splitlines()[0]!r} failed in a kernel of {python}:\n{''.join(streamed)}")
        elapsed = time.perf_counter() - started
        if PRINTED not in "".join(streamed):
            raise SystemExit(f"the %%gpu 2 cell did not print {PRINTED!r}:\n{''.join(streamed)}")
        return elapsed
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)
        shutil.rmtree(specs)


def alternated(times: int, first, second) -> tuple[list[float], list[float]]:
    """`first()` and `second()` `times` times each, which goes first flipped every time."""
    firsts, seconds = [], []
    for index in range(times):
        if index % 2 == 0:
            firsts.append(first())
            seconds.append(second())
        else:
            seconds.append(second())
            firsts.append(first())
    return firsts, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=f"{GATEWAY_FIRST_COMMIT}^",
                        help="the commit the 'before' side installs (default: the one before the gateway)")
    parser.add_argument("--calls", type=int, default=15, help="warm calls per side")
    parser.add_argument("--kernels", type=int, default=5, help="fresh kernels per side")
    parser.add_argument("--out", default=None, help="write the results file into this folder instead of "
                        "benchmarks/results (a smoke run that must not replace the measured file)")
    args = parser.parse_args()
    for name in ("calls", "kernels"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    before_commit = commit_of(args.before)
    install = BeforeInstall(before_commit).ensure()
    load_before = os.getloadavg()
    workdir = tempfile.mkdtemp(prefix="gs-bench-now-cwd-")
    before = BeforeCluster(install, CLUSTER_GPUS)
    try:
        with local_cluster(gpus=CLUSTER_GPUS):
            import ray

            from gpusession.broker import client

            client.broker()  # made here, so the gateway host finds its ledger and secrets
            gateway = GatewaySide(ray.get_runtime_context().gcs_address, client.ledger_path_here())
            old_kernel = BeforeKernel(before, WARM_LOOP)
            try:
                gateway.call()  # warm-up alike, discarded: each side's node host, rank code, imports
                old_kernel.call()
                warm_now, warm_before = alternated(args.calls, gateway.call, old_kernel.call)
                kernels_now, kernels_before = alternated(
                    args.kernels,
                    lambda: fresh_kernel_seconds(sys.executable, gateway.kernel_env(), workdir),
                    lambda: fresh_kernel_seconds(install.python, before.env(), before.workdir))
            finally:
                old_kernel.stop()
                gateway.stop()
    finally:
        before.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores (at the start: {load_before[0]:.1f})")
    print(f"the commit before the gateway: {before_commit[:12]}")
    print(f"warm call through the gateway (today's hub kernel): {spread(warm_now)} s")
    print(f"warm call of a Ray-driver kernel at {before_commit[:7]}: {spread(warm_before)} s")
    print(f"fresh kernel, %load_ext + first %%gpu 2, today: {spread(kernels_now)} s")
    print(f"fresh kernel, %load_ext + first %%gpu 2, at {before_commit[:7]}: {spread(kernels_before)} s")
    before_side = (f"gpusession at {before_commit[:12]}, the commit before the gateway, installed in a venv of its "
                   "own with a Ray head of its own (4 logical GPUs, its broker started); the kernel a Ray driver "
                   "with RAY_ADDRESS, as hub kernels were then")
    now_side = ("a Ray head of its own (4 logical GPUs, its broker started) and a gateway host joined to it "
                "(gateway.hosted.serve_run behind a GatewayServer, as the hub's gateway process is); the kernel "
                "has GPUSESSION_GATEWAY and no Ray address, and imports no Ray")
    rows = [
        Row("hub kernel's warm call: call-to-result of a 2-rank allreduce, through the gateway", "s", warm_now,
            f"the same call at the commit before the gateway ({before_commit[:7]}, a Ray-driver kernel)", warm_before,
            f"each side a long-lived process timing its own calls; one call each discarded first; "
            f"{args.calls} calls each, alternated, which side goes first flipped each time; "
            f"today: {now_side}; before: {before_side}", "<= 1.15 (issue 28)"),
        Row("fresh kernel: %load_ext gpusession and its first %%gpu 2 cell's result, through the gateway", "s",
            kernels_now, f"the same at the commit before the gateway ({before_commit[:7]}, a Ray-driver kernel)",
            kernels_before,
            f"a new ipykernel per sample, timed from its ready state: the two cells sent one after the other, the "
            f"printed all-reduced value checked; {args.kernels} kernels each, alternated, which side goes first "
            f"flipped each sample; today: {now_side}; before: {before_side}", "< 1.0 (issue 28: faster than before)"),
    ]
    write("before_gateway", rows, loadavg_before=load_before, folder=Path(args.out) if args.out else None)
    print(f"ratio through the gateway / before, warm call: {_ratio(warm_now, warm_before):.3f} (target <= 1.15)")
    print(f"ratio today / before, fresh kernel's first %%gpu 2: {_ratio(kernels_now, kernels_before):.3f} "
          "(target < 1.0)")


def _ratio(mine: list[float], theirs: list[float]) -> float:
    return statistics.median(mine) / statistics.median(theirs)


if __name__ == "__main__":
    main()
