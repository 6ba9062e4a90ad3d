"""The checks only a real GPU can answer, in one short run (the suite never needs a GPU):

    PYTHONPATH=.:benchmarks python benchmarks/gpu_check.py [--out DIR]

on a machine with an NVIDIA GPU and Ray installed. It starts the embedded cluster (the machine's
real GPUs, no logical ones) and checks:
  lease     a 1-GPU call's rank sees its lease's CUDA_VISIBLE_DEVICES, torch.cuda, backend nccl,
            an all_reduce on the GPU; its process shows in nvidia-smi while it runs
  release   once the call returned: seconds until nvidia-smi lists no compute process and the
            GPU's used memory is back to its level before the first call (the warm parent never
            touches CUDA, so nothing of gpusession holds the GPU between calls)
  fresh     a second call runs in a new process (another pid), forked by the same warm parent
  exclusive two background 1-GPU runs on a 1-GPU machine: the second's code starts only after
            the first's ended
  failures  the same release after a rank raises (from the WorkerFailed reaching the caller),
            after run.cancel() (from the cancel), and after the calling process is SIGKILLed
            (from the kill: the broker hears the caller is gone)
  options   1-rank DDP training on nccl under each communication option (precision bf16/fp16,
            grad_compression fp16/bf16/powersgd): final loss next to the plain run's, the receipt
  scaling   benchmarks/_scaling_train.py (the script benchmarks/scaling.py runs) at 1 rank on the
            GPU with nccl: samples/s under @gs.distributed vs torchrun --nproc-per-node 1
            --standalone, one untimed run each first, then alternated; ratio last
Writes DIR/gpu_check.json (default benchmarks/results/): the scaling row for the speed table and
every check's findings under "details". A check that fails is recorded with its error; the others
still run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _results import Row, spread, write  # noqa: E402

import gpusession as gs  # noqa: E402


def smi(query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def gpu_memory_used_mib() -> int:
    return int(smi("gpu=memory.used")[0][0])


def compute_pids() -> list[int]:
    return [int(row[0]) for row in smi("compute-apps=pid,used_memory") if row and row[0].isdigit()]


def until(predicate, limit_s: float = 30.0, every_s: float = 0.02) -> float | None:
    """Seconds until predicate() is true, polled every 20 ms; None when it stayed false for limit_s."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if predicate():
            return round(time.perf_counter() - started, 3)
        time.sleep(every_s)
    return None


def released(baseline_mib: int, since: float) -> dict:
    """Seconds from `since` (perf_counter) until the GPU had no compute process, and until its used
    memory was back to the baseline (nvidia-smi reports whole MiB: 2 MiB of slack)."""
    def after(predicate):
        return None if until(predicate) is None else round(time.perf_counter() - since, 3)

    return {"no_compute_process_after_s": after(lambda: not compute_pids()),
            "memory_back_after_s": after(lambda: gpu_memory_used_mib() <= baseline_mib + 2),
            "memory_used_mib": gpu_memory_used_mib(), "left_pids": compute_pids()}


@gs.distributed(gpus=1)
def probe(hold_s: float = 0.0, fail: bool = False):
    import torch.distributed as dist
    entered = time.time()
    ctx = gs.context()
    x = torch.ones(256, 1024, 1024, device=ctx.device)  # 1 GiB, so the process shows in nvidia-smi
    dist.all_reduce(x[0, 0, :8])
    torch.cuda.synchronize()
    seen_by_smi = [int(r[0]) for r in smi("compute-apps=pid,used_memory") if r and r[0].isdigit()]
    if fail:
        raise RuntimeError("planted failure with 1 GiB on the GPU")
    time.sleep(hold_s)
    return {"pid": os.getpid(), "ppid": os.getppid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_count": torch.cuda.device_count(), "device": str(ctx.device), "backend": dist.get_backend(),
            "gpu_ids": list(ctx.gpu_ids), "logical_gpus": ctx.logical_gpus, "all_reduce": x[0, 0, 0].item(),
            "allocated_mib": torch.cuda.memory_allocated() // 2**20, "name": torch.cuda.get_device_name(),
            "rank_pid_in_nvidia_smi": os.getpid() in seen_by_smi, "entered": entered, "left": time.time()}


def check_lease_release_fresh(found: dict) -> None:
    baseline = gpu_memory_used_mib()
    found["memory_used_before_first_call_mib"] = baseline
    started = time.perf_counter()
    first = probe()
    returned = time.perf_counter()
    found["lease"] = {**first, "first_call_s": round(returned - started, 2)}
    found["release"] = released(baseline, returned)
    started = time.perf_counter()
    second = probe()
    found["release_second_call"] = released(baseline, time.perf_counter())
    found["fresh"] = {"first_pid": first["pid"], "second_pid": second["pid"], "new_process": first["pid"] != second["pid"],
                      "same_warm_parent": first["ppid"] == second["ppid"],
                      "repeat_call_s": round(time.perf_counter() - started, 2)}


def check_exclusive(found: dict) -> None:
    runs = [probe.submit(1.5), probe.submit(1.5)]
    first, second = sorted((run.result(timeout=120) for run in runs), key=lambda r: r["entered"])
    found["exclusive"] = {"second_entered_minus_first_left_s": round(second["entered"] - first["left"], 3),
                          "second_started_after_first_ended": second["entered"] >= first["left"]}


KILLED_DRIVER = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{root!r}, {here!r}]
    import gpu_check
    gpu_check.probe(600)
""")


def check_failures(found: dict) -> None:
    baseline = gpu_memory_used_mib()
    try:
        probe(fail=True)
        found["failed_rank"] = {"error": "the planted failure did not raise"}
    except gs.WorkerFailed as error:
        raised = time.perf_counter()
        found["failed_rank"] = {"raised": type(error).__name__, **released(baseline, raised)}
    run = probe.submit(600)
    until(lambda: bool(compute_pids()), limit_s=120)
    cancelled = time.perf_counter()
    run.cancel()
    found["cancelled"] = released(baseline, cancelled)
    try:
        run.result(timeout=60)
    except Exception as error:  # RunCancelled, the run's own end
        found["cancelled"]["raised"] = type(error).__name__
    driver = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER.format(root=str(HERE.parent), here=str(HERE))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if until(lambda: bool(compute_pids()), limit_s=120) is None:
        driver.kill()
        found["killed_caller"] = {"error": "the driver's rank never showed in nvidia-smi"}
        return
    os.killpg(driver.pid, signal.SIGKILL)  # the calling process and anything it started itself
    killed = time.perf_counter()
    driver.wait()
    found["killed_caller"] = released(baseline, killed)


def _options_train(steps: int):
    ctx = gs.context()
    torch.manual_seed(0)
    model = gs.prepare_model(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1)).to(ctx.device)
    y = torch.tanh(x[:, :1])
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        gs.step(loss, optimizer)
    return {"loss": loss.item(), "backend": ctx.backend}


def check_options(found: dict) -> None:
    results = {}
    for name, options in [("plain", {}), ("precision bf16", {"precision": "bf16"}),
                          ("precision fp16", {"precision": "fp16"}),
                          ("grad_compression fp16", {"grad_compression": "fp16"}),
                          ("grad_compression bf16", {"grad_compression": "bf16"}),
                          ("grad_compression powersgd", {"grad_compression": "powersgd"})]:
        try:
            train = gs.distributed(gpus=1, **options)(_options_train)
            value = train(200)
            comm = getattr(train.last_run, "communication", None)
            results[name] = {**value, "receipt": comm.summary() if comm is not None else None}
        except Exception as error:  # one option's failure is a finding, not the end of the check
            results[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
    found["options"] = results


def measure_scaling(samples: int, steps: int) -> Row:
    import _scaling_train
    ours, theirs = [], []
    train = gs.distributed(gpus=1)(_scaling_train.train)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--standalone",
               str(HERE / "_scaling_train.py"), "link", "none", str(steps), "20"]

    def torchrun() -> float:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
        line = next(text for text in done.stdout.splitlines() if text.startswith("RESULT "))
        return json.loads(line[len("RESULT "):])["samples_per_s"]

    train("link", "none", steps, 20)  # warm-up alike: one untimed run on each side
    torchrun()
    for index in range(samples):
        for side in (("gs", "torchrun") if index % 2 == 0 else ("torchrun", "gs")):
            if side == "gs":
                ours.append(train("link", "none", steps, 20)["samples_per_s"])
            else:
                theirs.append(torchrun())
    print(f"gpusession {spread(ours)} samples/s, torchrun {spread(theirs)}", flush=True)
    return Row(measure="link-bound model, 1 rank on a real GPU: samples/s", unit="samples/s",
               gpusession_samples=ours, alternative="torchrun --nproc-per-node 1 --standalone",
               alternative_samples=theirs, goal=">= 0.97",
               configured=f"the same DDP script (benchmarks/_scaling_train.py, plain DDP), nccl, 20 warm-up and "
                          f"{steps} timed steps; one untimed run on each side first, then alternated",
               note=f"{samples} samples per side")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    load_before = os.getloadavg()
    found: dict = {"torch": torch.__version__}
    rows: list[Row] = []
    checks = [("lease", lambda: check_lease_release_fresh(found)), ("exclusive", lambda: check_exclusive(found)),
              ("failures", lambda: check_failures(found)), ("options", lambda: check_options(found)),
              ("scaling", lambda: rows.append(measure_scaling(args.samples, args.steps)))]
    for name, check in checks:
        started = time.perf_counter()
        try:
            check()
        except Exception:
            found.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
        print(f"{name}: {time.perf_counter() - started:.1f} s", flush=True)
        path = write("gpu_check", rows, loadavg_before=load_before, details=found, folder=Path(args.out))
    print(json.dumps(json.loads(path.read_text()), indent=1))
    if rows:
        print(f"ratio {rows[0].as_json()['ratio']:.3f} (gpusession / torchrun samples/s, 1 rank, nccl)")


if __name__ == "__main__":
    main()
