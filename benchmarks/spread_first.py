"""The first 4-rank DDP call spread over 2 cold hosts, from a new driver process, against torchrun
started by hand on the same hosts (issue 23, item 5: "the first call within 1.5x of torchrun
started by hand"), on simulated hosts (tests/multihost/simcluster.py: network namespaces, 2
logical GPUs on each of 2 hosts, gloo on CPU; needs root). Both sides run the same small DDP
function (Linear(4, 1) in DDP, 5 steps, an all_reduce and an all_gather) and are timed as a whole,
from launching the process(es) to the last one exiting:

- gpusession: `python _spread_first_driver.py` on the head (import gpusession, one
  @gs.distributed(gpus=4, placement="spread") call, exit). Cold: the Ray cluster and gpusession's
  broker are running, but no gpusession process is on the GPU hosts (no node host, no warm
  parent, no spare worker: they are killed and gone before each sample), as after a cluster
  start or once the node hosts stopped on their idle timeout.
- torchrun: one launcher per GPU host, started together (`--nnodes=2 --nproc-per-node=2`, c10d
  rendezvous on host 1), running the same function as a script (_spread_first_train.py).
  Cold: nothing of it runs before; gpusession's node hosts are killed before its samples too, so
  no spare worker they were starting is beside it.
Neither side has a process with torch imported beforehand; both read the same files, in the page
cache after one discarded run of each. Samples alternate (gpusession first, then torchrun first).

    sudo .venv/bin/python benchmarks/spread_first.py [--samples 6]

Writes benchmarks/results/spread_first.json; the last line printed is the ratio gpusession / torchrun.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _results import Row, spread, write  # noqa: E402

from tests.multihost.simcluster import SimCluster, can_run, kill_session, namespace_pids  # noqa: E402

DRIVER = str(HERE / "_spread_first_driver.py")
SCRIPT = str(HERE / "_spread_first_train.py")
PORT = 29600
RUN_TIMEOUT_S = 600
COLD_TIMEOUT_S = 60
# What gpusession leaves on a GPU host between calls (process titles Ray gives its actors, and the
# warm parent's command line): a sample is cold once none of these is left on either host.
WARM_MARKS = ("ray::NodeHost", "ray::Worker", "gpusession.run.node.zygote")
START_BROKER = "import ray; ray.init(); from gpusession.broker import client; client.broker(); print('broker up')"
KILL_NODE_HOSTS = """
import ray
ray.init()
from gpusession.run.node.nodehost import NAMESPACE, host_name
for node in ray.nodes():
    try:
        ray.kill(ray.get_actor(host_name(node["NodeID"]), namespace=NAMESPACE), no_restart=True)
    except ValueError:  # no host on that node
        pass
"""


def head_script(cluster: SimCluster, code: str) -> str:
    proc = cluster.python(cluster.head, code)
    out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    if proc.returncode:
        raise SystemExit(f"a script on the head failed ({proc.returncode}):\n{out[-3000:]}")
    return out


def warm_processes(cluster: SimCluster) -> list[str]:
    found = []
    for host in cluster.workers:
        for pid in namespace_pids(host.netns):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            if any(mark in cmdline for mark in WARM_MARKS):
                found.append(f"{host.name}: {pid} {cmdline[:80]}")
    return found


def _kind(cmdline: str) -> str:
    for mark, kind in (("zygote", "warm parent (with its ranks)"), ("gpusession.run.node.prober", "prober"),
                       ("ray::NodeHost", "node host"), ("ray::Worker", "worker actor"), ("ray::IDLE", "idle Ray worker"),
                       ("setup_worker", "Ray worker starting")):
        if mark in cmdline:
            return kind
    return cmdline.split(" ")[0].rsplit("/", 1)[-1][:30]


def cpu_since(cluster: SimCluster, since: float) -> dict:
    """CPU seconds (with their reaped children's: a warm parent's ranks) of the processes on the
    GPU hosts started since `since`, by kind, and how many: where a cold call's work went."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime"))
    out: dict = {}
    for host in cluster.workers:
        for pid in namespace_pids(host.netns):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            started = boot + int(stat[19]) / ticks  # field 22 of stat; [0] here is field 3
            if started < since - 1.0:  # the clock's tick and btime's whole second
                continue
            cpu = sum(int(x) for x in stat[11:15]) / ticks  # utime, stime, cutime, cstime
            kind = _kind(cmdline)
            seconds, count = out.get(kind, (0.0, 0))
            out[kind] = (seconds + cpu, count + 1)
    return out


def described_cpu(cpu: dict) -> str:
    return ", ".join(f"{kind} {seconds:.1f} ({count})" for kind, (seconds, count) in
                     sorted(cpu.items(), key=lambda item: -item[1][0]))


def make_cold(cluster: SimCluster) -> None:
    head_script(cluster, KILL_NODE_HOSTS)
    deadline = time.monotonic() + COLD_TIMEOUT_S
    while (left := warm_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        raise SystemExit("gpusession's processes still on the hosts after killing the node hosts:\n" + "\n".join(left))


def gpusession_once(cluster: SimCluster) -> dict:
    make_cold(cluster)  # the sample's side of "cold"
    launched = time.time()
    proc = cluster.python(cluster.head, DRIVER)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        raise SystemExit("the gpusession driver ran past its timeout:\n" + proc.communicate()[0][-3000:])
    ended = time.time()
    cpu = cpu_since(cluster, launched)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"the gpusession driver failed ({proc.returncode}):\n{out[-3000:]}")
    r = json.loads(lines[-1][len("RESULT "):])
    if len(r["hosts"]) != 2:
        raise SystemExit(f"the spread call ran on {r['hosts']}")
    ranks = r["ranks"]
    phases = {"python and imports": r["imported"] - launched, "to the call": r["called"] - r["imported"],
              "queued": r["queued_s"], "setup (grant to every rank in the function)": r["setup_s"],
              "call to the last rank in the function": max(x["entered"] for x in ranks) - r["called"],
              "prepare_model": max(x["wrapped"] - x["entered"] for x in ranks),
              "5 steps": max(x["stepped"] - x["wrapped"] for x in ranks),
              "2 collectives": max(x["returned"] - x["stepped"] for x in ranks),
              "last rank's return to the call's": r["returned"] - max(x["returned"] for x in ranks),
              "exit": ended - r["returned"]}
    return {"whole_s": ended - launched, "call_s": r["returned"] - r["called"], "phases": phases, "cpu": cpu}


def torchrun_once(cluster: SimCluster, sample: int) -> dict:
    make_cold(cluster)  # no spare the last gpusession call topped up still starting beside torchrun
    one, two = cluster.workers
    out_dir = tempfile.mkdtemp(prefix="spread-first-")
    port = PORT + sample  # a fresh port each run: the last run's may be in TIME_WAIT
    launched = time.time()
    procs = []
    for host in (one, two):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={one.ip}:{port}", f"--rdzv-id=first{sample}", SCRIPT]
        procs.append(cluster.popen(host, argv, env=cluster.env(host, GLOO_SOCKET_IFNAME="simnet0", SPREAD_FIRST_OUT=out_dir),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=RUN_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            kill_session(proc)
        raise SystemExit("torchrun ran past its timeout")
    ended = time.time()
    ranks = [json.loads(path.read_text()) for path in sorted(Path(out_dir).glob("rank*.json"))]
    shutil.rmtree(out_dir, ignore_errors=True)
    if any(p.returncode for p in procs) or len(ranks) != 4:
        raise SystemExit("torchrun failed:\n" + "\n---\n".join(o[-3000:] for o in outputs))
    phases = {"launch to the last rank's start": max(x["started"] for x in ranks) - launched,
              "import torch": max(x["imported"] - x["started"] for x in ranks),
              "rendezvous and process group": max(x["joined"] - x["imported"] for x in ranks),
              "DDP": max(x["wrapped"] - x["joined"] for x in ranks),
              "5 steps": max(x["stepped"] - x["wrapped"] for x in ranks),
              "2 collectives and destroy": max(x["returned"] - x["stepped"] for x in ranks),
              "exit": ended - max(x["returned"] for x in ranks)}
    return {"whole_s": ended - launched, "phases": phases}


def median_phases(samples: list[dict]) -> str:
    names = samples[0]["phases"]
    return ", ".join(f"{name} {statistics.median(s['phases'][name] for s in samples):.2f}" for name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6)
    args = parser.parse_args()
    reason = can_run()
    if reason:
        raise SystemExit(reason)
    loadavg_before = os.getloadavg()
    cluster = SimCluster(hosts=2, gpus_per_host=2, extra_env={"GPUSESSION_PG_TIMEOUT_S": "120"})
    ours: list[dict] = []
    theirs: list[dict] = []
    try:
        cluster.start()
        print(head_script(cluster, START_BROKER).strip().splitlines()[-1], flush=True)
        for name, run in (("gpusession", lambda: gpusession_once(cluster)), ("torchrun", lambda: torchrun_once(cluster, 0))):
            result = run()
            print(f"discarded first run ({name}, reads the files into the page cache): {result['whole_s']:.1f} s; "
                  + ", ".join(f"{k} {v:.2f}" for k, v in result["phases"].items()), flush=True)
            if "cpu" in result:
                print(f"  CPU s on the GPU hosts by processes started since the launch: {described_cpu(result['cpu'])}")
        for sample in range(1, args.samples + 1):
            sides = [("gpusession", ours, lambda: gpusession_once(cluster)),
                     ("torchrun", theirs, lambda s=sample: torchrun_once(cluster, s))]
            for name, into, run in (sides if sample % 2 else sides[::-1]):
                result = run()
                into.append(result)
                print(f"sample {sample}, {name}: {result['whole_s']:.2f} s; "
                      + ", ".join(f"{k} {v:.2f}" for k, v in result["phases"].items()), flush=True)
                if "cpu" in result:
                    print(f"  CPU s on the GPU hosts by processes started since the launch: "
                          f"{described_cpu(result['cpu'])}", flush=True)
    finally:
        cluster.stop()
    row = Row(measure="first 4-rank DDP call (Linear(4, 1) in DDP, 5 steps, all_reduce, all_gather) spread over 2 "
                      "cold hosts, from a new process: launch to exit",
              unit="s", gpusession_samples=[s["whole_s"] for s in ours],
              alternative="torchrun started by hand, one launcher per host (--nproc-per-node 2, c10d rendezvous on "
                          "host 1), the same function as a script",
              alternative_samples=[s["whole_s"] for s in theirs],
              configured="simulated hosts (network namespaces), 2 logical GPUs on each of 2 hosts, gloo on CPU; "
                         "gpusession: a new driver on the head, Ray and the broker running, no gpusession process "
                         "on the hosts; torchrun: nothing running before; files in the page cache for both; "
                         "alternated",
              goal="<= 1.5",
              note=f"median s: gpusession {median_phases(ours)} (the call alone "
                   f"{statistics.median(s['call_s'] for s in ours):.2f}); torchrun {median_phases(theirs)}")
    path = write("spread_first", [row], loadavg_before=loadavg_before)
    print(f"gpusession {spread(row.gpusession_samples)} s vs torchrun {spread(row.alternative_samples)} s; "
          f"{row.note}; written to {path}")
    print(row.as_json()["ratio"])


if __name__ == "__main__":
    main()
