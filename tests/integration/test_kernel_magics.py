"""%%gpu and %gpu through a real IPython kernel, asserting on what a notebook frontend receives.

One kernel serves the module (starting one and importing torch and Ray costs seconds); each test
uses its own variable names so they do not interfere.
"""
from __future__ import annotations

import time

import pytest

import gpusession as gs
from gpusession.broker import client

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for
from .kernels import Kernel
from ..machine import cluster_line, gpus_text


@pytest.fixture(scope="module")
def kernel(cluster, tmp_path_factory):
    started = Kernel(cluster.env(), tmp_path_factory.mktemp("notebook"))
    try:
        started.ok("%load_ext gpusession\nimport torch, gpusession as gs")
        yield started
    finally:
        started.shutdown()


def _ledger_rows(cluster) -> int:
    auth = {"token": cluster.admin_token, "user": "admin"}
    return len(client.call(client.broker().leases, auth, include_ended=True, limit=10_000))


def test_output_streams_live_with_rank_prefixes_before_the_cell_finishes(kernel, tmp_path):
    gate = tmp_path / "go"
    seen_before_reply = []

    def on_message(msg):
        if msg["msg_type"] == "stream" and "waiting for the notebook" in msg["content"]["text"]:
            seen_before_reply.append(not kernel.reply_waiting())
            gate.touch()  # only now may the cell finish

    run = kernel.execute(f"""%%gpu 2
import os, time
print(f"rank {{gs.context().rank}} waiting for the notebook", flush=True)
while not os.path.exists({str(gate)!r}):
    time.sleep(0.01)
print("done")
""", on_message=on_message)
    assert run.status == "ok"
    assert seen_before_reply and all(seen_before_reply)
    out = run.stream("stdout")
    assert "[rank 0] rank 0 waiting for the notebook\n" in out
    assert "[rank 1] rank 1 waiting for the notebook\n" in out
    assert "[rank 0] done\n" in out and "[rank 1] done\n" in out


def test_assigned_names_come_back_and_the_last_expression_is_the_cell_result(kernel, cluster):
    kernel.ok("base = 10")
    run = kernel.ok("""%%gpu 2
rank = gs.context().rank
world = gs.context().world_size
t = torch.full((2,), float(base + rank))
t.sum().item() + world
""")
    assert run.result == "22.0"  # rank 0: 10 + 10, plus world size 2
    assert kernel.value("(rank, world, t.tolist(), t.device.type)") == (0, 2, [10.0, 10.0], "cpu")
    receipts = [m for m in run.displays("text/plain") if "GPU·s" in m["content"]["data"]["text/plain"]]
    assert len(receipts) == 1
    receipt = receipts[0]["content"]["data"]["text/plain"]
    assert gpus_text(2, logical=cluster.logical) in receipt and "released" in receipt and "queued" in receipt
    assert "setup" in receipt and "run" in receipt
    assert ("the workers ran on the CPU" in receipt) is cluster.logical
    assert kernel.value("(_gpu.gpus, _gpu.end_reason, _gpu.released)") == (2, "finished", True)


def test_out_limits_the_names_and_no_out_brings_none(kernel):
    kernel.ok("%%gpu --out kept\nkept = 1\ndropped = 2")
    assert kernel.value("('kept' in dir(), 'dropped' in dir())") == (True, False)
    run = kernel.ok("%%gpu --no-out\nnothing_back = 3\nnothing_back + 1")
    assert run.result == "4"  # still displayed
    assert kernel.value("'nothing_back' in dir()") is False


def test_a_model_trained_in_a_cell_is_left_trained_on_cpu_and_usable(kernel):
    kernel.ok("""
net = torch.nn.Linear(4, 1)
before = net.weight.detach().clone()
""")
    kernel.ok("""%%gpu 2
net = gs.prepare_model(net)
opt = torch.optim.SGD(net.parameters(), lr=0.5)
for step in range(5):
    loss = net(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
""")
    checks = kernel.value("""(
    type(net) is torch.nn.Linear,
    not torch.equal(net.weight, before),
    net.weight.device.type,
    tuple(net(torch.ones(3, 4)).shape),
    opt.param_groups[0]["params"][0] is net.weight,
)""")
    assert checks == (True, True, "cpu", (3, 1), True)


def test_unpicklable_names_are_skipped_with_one_line_each(kernel):
    kernel.ok("import threading\nlock = threading.Lock()")
    run = kernel.ok("""%%gpu
try:
    lock
    lock_arrived = True
except NameError:
    lock_arrived = False
new_lock = threading.Lock()
fine = "yes"
""")
    err = run.stream("stderr")
    assert "'lock' was not sent to the workers" in err and "'new_lock' was not brought back" in err
    assert kernel.value("(lock_arrived, fine, 'new_lock' in dir())") == (False, "yes", False)


def test_metrics_render_as_one_table_and_one_plot_updated_in_place(kernel):
    run = kernel.ok("""%%gpu
import time
for step in range(40):
    gs.report(step=step, loss=1.0 / (step + 1), acc=step / 40)
    time.sleep(0.02)
""")
    plots = run.displays("image/png")
    tables = [m for m in run.displays("text/html") if "gpusession-metrics" in m["content"]["data"]["text/html"]]
    for drawn in (plots, tables):
        assert len({m["content"]["transient"]["display_id"] for m in drawn}) == 1
        # created empty before any worker could print (the log goes below it), then updated in place
        same = [m for m in run.of_type("display_data", "update_display_data")
                if m["content"].get("transient", {}).get("display_id") == drawn[0]["content"]["transient"]["display_id"]]
        assert same[0]["msg_type"] == "display_data" and all(m["msg_type"] == "update_display_data" for m in same[1:])
    assert 2 <= len(plots) < 40  # drawn live, but throttled
    assert len(tables) < 40
    assert "39" in tables[-1]["content"]["data"]["text/plain"]  # the final state is drawn
    assert kernel.value("len(_gpu.history)") == 40


def _text(msg: dict) -> str:
    return msg["content"]["data"].get("text/plain", "")


def _display_id(msg: dict) -> str:
    return msg["content"]["transient"]["display_id"]


def test_the_status_line_shows_the_queue_then_moves_on_in_place_on_grant(kernel, cluster):
    holder = gs.lease(gpus=CLUSTER_GPUS)  # every GPU: the kernel's cell must queue
    status: list[dict] = []

    def on_message(msg):
        if msg["msg_type"] in ("display_data", "update_display_data"):
            if not status and "asking the cluster" in _text(msg) or status and _display_id(msg) == _display_id(status[0]):
                status.append(msg)
            if sum("waiting for 1 GPU" in _text(m) for m in status) == 3:
                holder.release()  # after the queue line was drawn and updated twice

    try:
        run = kernel.execute("%%gpu\nprint('granted')", on_message=on_message)
    finally:
        holder.release()
    assert run.status == "ok" and "granted" in run.stream("stdout")
    first, *updates = status
    assert first["msg_type"] == "display_data" and all(m["msg_type"] == "update_display_data" for m in updates)
    queued = [_text(m) for m in status if "waiting for 1 GPU" in _text(m)]
    assert "position 1 in the queue" in queued[0] and "waiting for capacity" in queued[0]
    waited = [int(line.rsplit("· ", 1)[1].rstrip(" s")) for line in queued]
    assert waited == sorted(waited) and waited[-1] > waited[0]  # the elapsed time keeps moving
    assert all(_text(m).strip() for m in status)  # never blank: the queue line becomes the next phase
    assert _text(status[-1]).startswith(f"done · {gpus_text(1, logical=cluster.logical)} · queued")
    assert kernel.value("_gpu.queued_s > 1")


def test_a_distributed_function_called_in_the_notebook_renders_the_same_way(kernel):
    run = kernel.ok("""
@gs.distributed(gpus=2)
def train(steps):
    for step in range(steps):
        gs.report(step=step, loss=1.0 / (step + 1))
    print("trained", flush=True)
    return gs.context().rank

train(5)
""")
    assert run.result == "0"
    assert "[rank 0] trained" in run.stream("stdout") and "[rank 1] trained" in run.stream("stdout")
    assert run.displays("image/png") and any("GPU·s" in _text(m) for m in run.displays("text/plain"))


def test_bad_flags_raise_usage_error_and_lease_nothing(kernel, cluster):
    rows = _ledger_rows(cluster)
    mistakes = ("%%gpu two", "%%gpu 2 --priority urgent", "%%gpu --timeout -5", "%%gpu --out x\ny = 1",
                "%%gpu\n!echo shell commands stay local", "%%gpu\nx = (")
    for line in mistakes:
        run = kernel.execute(f"{line}\nprint('must not run')")
        assert run.status == "error" and run.error_name == "UsageError", line
        assert "must not run" not in run.stream("stdout")
        shown = "\n".join(line for error in run.of_type("error") for line in error["content"]["traceback"])
        assert "Traceback" not in shown and "File " not in shown  # a usage message, not a stack
    assert _ledger_rows(cluster) == rows


def test_a_failing_rank_shows_the_cell_line_in_the_remote_traceback(kernel):
    run = kernel.execute("""%%gpu 2
if gs.context().rank == 1:
    raise ValueError("bad batch 17")
torch.distributed.barrier()
""")
    assert run.error_name == "WorkerFailed"
    shown = "\n".join(run.of_type("error")[0]["content"]["traceback"])
    assert "bad batch 17" in shown and 'raise ValueError("bad batch 17")' in shown
    assert kernel.value("(_gpu.end_reason, _gpu.released)") == ("failed", True)


def test_status_and_release_line_magics(kernel, cluster):
    kernel.ok("held = gs.lease(gpus=1)")
    status = kernel.ok("%gpu status").stream("stdout")
    assert f"cluster: {cluster_line(CLUSTER_GPUS, logical=cluster.logical)}" in status and "1 leased" in status
    mine = status.split("leases held by this kernel")[1]
    assert "1 GPUs" in mine and "held" in mine
    released = kernel.ok("%gpu release").stream("stdout")
    assert "Released 1 lease" in released
    assert free_gpus() == CLUSTER_GPUS
    assert "holds no leases" in kernel.ok("%gpu release").stream("stdout")


def test_stop_button_frees_the_gpus_within_a_second_and_keeps_the_history(kernel):
    timing = {}

    def on_message(msg):
        # rank 0's line: its gs.report(step=0) went out before it, so the history has it
        if msg["msg_type"] == "stream" and "[rank 0] training started" in msg["content"]["text"] and not timing:
            timing["interrupted"] = time.monotonic()
            kernel.manager.interrupt_kernel()
            wait_for(lambda: free_gpus() == CLUSTER_GPUS, timeout=10, interval=0.005)
            timing["free"] = time.monotonic()

    run = kernel.execute("""%%gpu 2
import time
gs.report(step=0)
print("training started", flush=True)
for step in range(1, 10**9):
    gs.report(step=step)
    time.sleep(0.05)
""", on_message=on_message)
    stopped_after = time.monotonic() - timing["interrupted"]  # the cell's reply is in
    assert run.error_name == "KeyboardInterrupt"
    assert "2 GPUs were released" in "\n".join(run.of_type("error")[0]["content"]["traceback"])
    freed_after = timing["free"] - timing["interrupted"]
    print(f"GPUs free {freed_after:.3f} s after the interrupt; the cell ended after {stopped_after:.3f} s")
    assert freed_after < 1.0, f"GPUs free {freed_after:.3f} s after the interrupt: bound 1 s, no margin"
    assert kernel.value("(_gpu.end_reason, _gpu.released, len(_gpu.history) > 0)") == ("interrupted", True, True)


def test_a_rank_killed_in_a_cell_restarts_and_the_cell_keeps_the_restart_line_to_the_end(kernel, cluster):
    run = kernel.ok("""%%gpu 2
import os
resumed = gs.load_checkpoint() or {"step": 0}
for restart_step in range(resumed["step"], 6):
    gs.save_checkpoint({"step": restart_step + 1})
    gs.report(step=restart_step)
    if restart_step == 3 and gs.context().rank == 1 and gs.context().attempt == 0:
        os.kill(os.getpid(), 9)
    torch.distributed.barrier()
""")
    status_id = _display_id(next(m for m in run.of_type("display_data") if "asking the cluster" in _text(m)))
    shown = [_text(m).splitlines() for m in run.of_type("display_data", "update_display_data")
             if _display_id(m) == status_id]

    def tells_the_restart(line: str) -> bool:
        return "rank 1 died" in line and "SIGKILL" in line and "restarting" in line and "(attempt 2 of 4)" in line

    assert any(tells_the_restart(lines[0]) for lines in shown)  # the status line said it when it happened
    after = [lines for lines in shown if lines[0].startswith("running") and len(lines) > 1]
    assert after and all(tells_the_restart(lines[1]) for lines in after)  # and it stays under the line
    receipt, *kept = shown[-1]
    assert receipt.startswith(f"done · {gpus_text(2, logical=cluster.logical)}") and "· 1 restart ·" in receipt
    assert len(kept) == 1 and tells_the_restart(kept[0])
    assert kernel.value("(_gpu.restarts, _gpu.end_reason, sorted(_gpu.rank_hosts))") == (1, "finished", [0, 1])
    assert kernel.value("[report['step'] for report in _gpu.history]") == list(range(6))
