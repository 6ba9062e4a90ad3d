"""A user's script on the head of the simulated cluster (RAY_ADDRESS is set): runs spread over
both hosts that go on until a host is lost under them (the test kills it or cuts its link).
Run 0 asks for 4 GPUs and cannot go on without the lost host; run 1 asks for 2 (one rank per
host) and restarts at once on the other GPU of the host that remains, from its last checkpoint;
run 2 is elastic (4 GPUs, min_gpus=2) and goes on with the 2 ranks of the host that remains.

    python node_loss_script.py MARKER_PREFIX RUNS

Run i (0, 1, ...): every rank writes MARKER_PREFIX-<i>-rank<r> (its host, its scratch
directory) once the run is in its stride; when the run ends the script prints
`RESULT {json}`: the error the caller saw and when (time.time(): every simulated host shares
the machine's clock), what Ray showed free right after, the receipt, the ledger's row. Then it
waits for the file MARKER_PREFIX-<i>.go (the test brings the lost host back) before run i + 1.
One driver for every scenario: its warm workers on the surviving host serve the next run.

After run 0 (the host's processes killed), while the host is still down, it also tries what a
user would next (capacity_while_lost): a 4-GPU call, which must wait ungranted, and a 2-GPU call,
which must run on the survivor. It prints `WAITING {json}` once the 4-GPU call waits (the test
then starts the host again) and `CAPACITY {json}` once that call ran, with the broker's ledger.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import ray

import gpusession as gs
from gpusession.observe import events
from gpusession.cluster import raycluster


def steps_until_lost(marker_prefix: str):
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    for step in range(1_000_000):
        dist.all_reduce(torch.ones(1))
        if step == 10:
            with open(f"{marker_prefix}-rank{ctx.rank}", "w") as f:
                json.dump({"host": socket.gethostname(), "scratch_dir": ctx.scratch_dir, "lease_id": ctx.lease_id,
                           "node_id": ctx.node_id, "address": ctx.address}, f)
        time.sleep(0.05)


def checkpointed_steps(marker_prefix: str, steps_after: int = 10):
    """Checkpoints every step. The first attempt goes on until a host is lost under it (rank
    markers as steps_until_lost); a later one makes steps_after more steps and says what it was.
    Each step's report says when it was made, and in which attempt."""
    import socket

    import torch
    import torch.distributed as dist

    ctx = gs.context()
    state = gs.load_checkpoint() or {"step": 0}
    step = state["step"]
    end = None if ctx.attempt == 0 else step + steps_after
    while end is None or step < end:
        total = torch.ones(1)
        dist.all_reduce(total)
        gs.report(step=step, world_size=ctx.world_size, total=total.item(), attempt=ctx.attempt, at=time.time())
        step += 1
        gs.save_checkpoint({"step": step})
        if step == 10 and ctx.attempt == 0:
            with open(f"{marker_prefix}-rank{ctx.rank}", "w") as f:
                json.dump({"host": socket.gethostname(), "scratch_dir": ctx.scratch_dir, "lease_id": ctx.lease_id,
                           "node_id": ctx.node_id, "address": ctx.address}, f)
        time.sleep(0.05)
    return {"world_size": ctx.world_size, "attempt": ctx.attempt, "resumed_at": state["step"], "step": step}


class Transitions(events.Observer):
    """Each restart or resize line with the time it was told (the cell would show it then)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def transition(self, info, line: str) -> None:
        self.lines.append((time.time(), line))


def main() -> None:
    transitions = Transitions()
    events.set_observer_factory(lambda world_size: transitions)
    ray.init()
    prefix, runs = sys.argv[1], int(sys.argv[2])
    for i in range(runs):
        if i:
            while not os.path.exists(f"{prefix}-{i - 1}.go"):
                time.sleep(0.1)
        transitions.lines = []
        result = one_run(f"{prefix}-{i}", transitions, kind=RUNS[i])
        if i == 0 and runs > 1:
            capacity_while_lost(result.get("lost_in_capacity_at"))


RUNS = ("fails", "moves", "elastic")


def one_run(prefix: str, transitions: Transitions, *, kind: str) -> dict:
    if kind == "elastic":  # a lost host leaves it on the 2 GPUs of the host that remains
        call = gs.distributed(gpus=4, min_gpus=2, placement="spread", timeout="240s")(checkpointed_steps)
    elif kind == "moves":  # one rank per host: the lost host's rank moves to the other's free GPU
        call = gs.distributed(gpus=2, placement="spread", timeout="240s")(checkpointed_steps)
    else:
        call = gs.distributed(gpus=4, placement="spread", timeout="240s")(steps_until_lost)
    result: dict = {}
    started = time.time()
    watching = threading.Event()
    if kind in ("elastic", "fails"):  # when the broker's capacity first counts the lost host's GPUs lost
        threading.Thread(target=watch_capacity, args=(result, watching), daemon=True).start()
    try:
        result["value"] = call(prefix)
    except BaseException as exc:
        result["error_time"] = time.time()
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)
        result["rank"] = getattr(exc, "rank", None)
    watching.set()
    result["wall_s"] = time.time() - started  # the call, as the user waited for it
    free = raycluster.available_gpus_by_node()
    result["free_after"] = {}  # per address: a host started again may briefly show its old node too
    for node in raycluster.nodes():
        result["free_after"][node.address] = max(result["free_after"].get(node.address, 0.0),
                                                 free.get(node.node_id, 0.0))
    info = call.last_run
    result["run_info"] = {k: getattr(info, k) for k in ("queued_s", "setup_s", "run_s", "gpu_seconds", "end_reason",
                                                       "released", "restarts", "transitions", "gpus", "history")}
    result["transitions"] = transitions.lines
    result["ledger"] = ledger_row(info.lease_id)
    print("RESULT " + json.dumps(result), flush=True)
    return result


def watch_capacity(result: dict, done: threading.Event) -> None:
    from gpusession.broker import client

    broker = client.broker()
    while not done.is_set():
        if client.call(broker.cluster)["gpus_lost"] >= 2.0:
            result["lost_in_capacity_at"] = time.time()
            return
        time.sleep(0.05)


def ledger_row(lease_id: int) -> dict:
    """The broker's record of the lease: where it was last, on which GPU ids, what it was billed."""
    import sqlite3

    from gpusession.broker import client

    columns = ("node_workers", "gpu_ids", "gpu_seconds", "granted_at", "released_at")
    row = sqlite3.connect(client.ledger_path_here()).execute(
        f"select {', '.join(columns)} from leases where id = ?", (lease_id,)).fetchone()
    out = dict(zip(columns, row))
    for key in ("node_workers", "gpu_ids"):
        out[key] = json.loads(out[key]) if out[key] else None
    return out


def capacity_while_lost(first_counted_at: float | None) -> None:
    """The broker's view right after the loss; a 4-GPU call that cannot be placed until the host
    is back (it must wait, ungranted and unbilled) and a 2-GPU call meanwhile. `first_counted_at`:
    when the run's watcher saw the broker count the lost GPUs, if it did before the run ended."""
    import sqlite3
    import threading

    from gpusession.broker import client

    broker = client.broker()
    admin = {"token": client.admin_token_here(), "user": "admin"}
    report: dict = {}
    deadline = time.monotonic() + 30
    while (view := client.call(broker.cluster))["gpus_lost"] != 2.0 and time.monotonic() < deadline:
        time.sleep(0.02)
    # The broker's moment, not this poll's: this starts only once the failed run has returned,
    # which the run's own bound allows to take longer.
    report["lost_seen_at"] = first_counted_at or time.time()
    report["view_when_lost"] = {k: view[k] for k in ("gpus_total", "gpus_free", "gpus_lost", "gpus_unmanaged")}
    report["ray_alive_gpu_nodes_then"] = sum(1 for n in raycluster.nodes() if n.gpus)  # Ray's own view

    four: dict = {}

    def ask_for_four() -> None:
        call = gs.distributed(gpus=4, placement="spread", return_all=True, timeout="240s")(
            lambda: gs.context().node_id)
        four["asked"] = time.time()
        try:
            four["nodes"] = sorted(set(call()))
        except Exception as exc:  # reported; the test shows it
            four["error"] = f"{type(exc).__name__}: {exc}"
        four["done"] = time.time()
        four["gpu_seconds"] = call.last_run.gpu_seconds

    caller = threading.Thread(target=ask_for_four, daemon=True)
    caller.start()
    deadline = time.monotonic() + 60
    while not (seen := [x for x in client.call(broker.leases, admin) if x["gpus"] == 4]) and "error" not in four:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    report["four_first_seen"] = four.get("error") or ({k: seen[0][k] for k in ("state", "wait_kind")} if seen else None)
    states = set()
    watch_until = time.monotonic() + 2.0
    while time.monotonic() < watch_until:
        states.update(x["state"] for x in client.call(broker.leases, admin) if x["gpus"] == 4)
        time.sleep(0.05)
    two = gs.distributed(gpus=2, return_all=True)(lambda: gs.context().node_id)
    report["two_gpu_nodes"] = sorted(set(two()))
    states.update(x["state"] for x in client.call(broker.leases, admin) if x["gpus"] == 4)
    report["four_states_while_lost"] = sorted(states)
    print("WAITING " + json.dumps(report), flush=True)  # the test starts the host again now

    caller.join(300)
    report["four"] = four
    ledger = sqlite3.connect(client.ledger_path_here())
    report["billed_unplaced"] = ledger.execute(
        "select count(*) from leases where placed_at is null and gpu_seconds > 0").fetchone()[0]
    report["rows"] = [dict(zip(("id", "gpus", "state", "placed", "gpu_seconds"), r)) for r in ledger.execute(
        "select id, gpus, state, placed_at is not null, gpu_seconds from leases order by id")]
    print("CAPACITY " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
