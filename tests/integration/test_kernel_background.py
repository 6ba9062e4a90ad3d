"""%%gpu --bg and train.submit through a real IPython kernel, asserting on what a notebook
frontend receives (iopub messages by cell) and on what Ray and the broker show."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gpusession.broker import client

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for
from .kernels import Kernel

FREE_WITHIN_S = 5.0  # SPEC section 4, measured from the SIGKILL

BODY = """%%gpu 2 --bg -o {name}
import time
for step in range(8):
    print("{name} step", step, flush=True)
    gs.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.4)
{name}_out = {value}
{value} * 2
"""


@pytest.fixture
def kernel(cluster, tmp_path):
    started = Kernel(cluster.env(), tmp_path)
    try:
        started.ok("%load_ext gpusession\nimport time, torch, gpusession as gs")
        yield started
    finally:
        started.shutdown()


def _texts(messages: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


@pytest.mark.slow
def test_two_background_cells_keep_their_own_views_while_other_cells_run_and_pull_their_names(kernel):
    first = kernel.ok(BODY.format(name="r1", value=11))
    second = kernel.ok(BODY.format(name="r2", value=22))
    assert kernel.value("r1.done() or r2.done()") is False, "a --bg cell returns before its run ends"
    others = [kernel.ok(f"print('other cell', {i})\ntime.sleep(0.5)") for i in range(6)]
    kernel.ok("r1.result(300); r2.result(300)", timeout=320)
    kernel.drain(1.0)
    assert kernel.value("'r1_out' in globals() or 'r2_out' in globals()") is False, \
        "a background cell's names are assigned only by pull()"
    pulled = kernel.ok("r1.pull(), r2.pull(), r1_out, r2_out")
    assert pulled.result == "(22, 44, 11, 22)"

    for i, other in enumerate(others):
        assert _texts(other.messages) == f"other cell {i}\n", "another cell shows only its own output"
        assert not other.of_type("display_data", "update_display_data"), "no run view lands in another cell"
    for cell, name in ((first, "r1"), (second, "r2")):
        after = kernel.late.get(cell.msg_id, [])
        shown = _texts(cell.messages) + _texts(after)
        assert f"[rank 0] {name} step 7" in shown and f"[rank 1] {name} step 7" in shown
        other_name = "r2" if name == "r1" else "r1"
        assert f"{other_name} step" not in shown, "a run's output never lands in the other run's cell"
        assert f"{name}.pull() assigns them" in shown, "the cell says how to get its names"
        updates = [m for m in after if m["msg_type"] == "update_display_data"]
        assert any("done" in m["content"]["data"].get("text/plain", "") for m in updates), \
            "the status line in the starting cell ends with the receipt"
        assert any("8 reports" in m["content"]["data"].get("text/plain", "") for m in updates), \
            "the metrics table in the starting cell keeps updating after the cell returned"
    wait_for(lambda: free_gpus() == CLUSTER_GPUS, timeout=10, message="all GPUs free")


@pytest.mark.slow
def test_the_stop_button_stops_the_foreground_cell_only_never_a_background_run(kernel):
    kernel.ok("%%gpu 2 --bg -o long\nimport time\nfor step in range(3000):\n    gs.report(step=step)\n"
              "    time.sleep(0.1)\n")
    wait_for(lambda: kernel.value("long.state.value") == "running", timeout=180, interval=0.5,
             message="the background run running")
    msg_id = kernel.client.execute("time.sleep(60)")
    time.sleep(1.0)
    kernel.manager.interrupt_kernel()
    deadline = time.monotonic() + 30
    reply = None
    while reply is None and time.monotonic() < deadline:
        msg = kernel.client.get_shell_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg
    assert reply is not None and reply["content"]["ename"] == "KeyboardInterrupt"
    steps = kernel.value("len(long.metrics)")
    time.sleep(1.5)
    assert kernel.value("long.state.value") == "running" and kernel.value("len(long.metrics)") > steps, \
        "the background run goes on reporting after the stop button"
    assert free_gpus() == CLUSTER_GPUS - 2
    kernel.ok("long.cancel()")
    wait_for(lambda: free_gpus() == CLUSTER_GPUS, timeout=5, message="GPUs free after cancel")
    wait_for(lambda: kernel.value("long.state.value") == "cancelled", timeout=10, interval=0.2,
             message="the run ended as cancelled")


@pytest.mark.slow
def test_killing_a_kernel_with_two_background_runs_frees_every_gpu_within_five_seconds(cluster, broker, admin,
                                                                                        tmp_path):
    kernel = Kernel(cluster.env(), tmp_path)
    try:
        kernel.ok("%load_ext gpusession\nimport time, gpusession as gs")
        for name in ("k1", "k2"):
            kernel.ok(f"%%gpu 2 --bg -o {name}\nimport time\nwhile True:\n    time.sleep(0.1)\n")
        wait_for(lambda: kernel.value("[r.state.value for r in (k1, k2)]") == ["running", "running"],
                 timeout=180, interval=0.5, message="both background runs running")
        assert free_gpus() == 0
        killed_at = time.monotonic()
        os.kill(kernel.manager.provisioner.pid, signal.SIGKILL)

        def freed() -> bool:
            return free_gpus() == CLUSTER_GPUS and not client.call(broker.leases, admin)

        wait_for(freed, timeout=FREE_WITHIN_S, message="GPUs free in Ray and the broker after the kernel died")
        assert time.monotonic() - killed_at < FREE_WITHIN_S
    finally:
        try:
            kernel.shutdown()
        except Exception:  # already dead: that was the point
            pass
