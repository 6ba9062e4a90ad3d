"""What the notebook display contains: queue line, metric table and plot data, receipt, throttle,
and the restarts and resizes kept under the status line."""
from __future__ import annotations

import time

from gpusession.observe.display import (
    Throttle,
    metric_series,
    metric_table,
    plot_png,
    queue_line,
    receipt_line,
    table_bundle,
    wants_log_scale,
)
from gpusession.errors import Preempted, RunCancelled, WorkerFailed
from gpusession.observe.events import RunInfo
from gpusession.observe.livestatus import changes_html, timed, with_changes_text


def test_queue_line_says_gpus_position_reason_and_elapsed():
    view = {"gpus": 2, "position": 3, "reason": "waiting for capacity: 4 of 4 GPUs in use"}
    assert queue_line(view, 12.4) == (
        "waiting for 2 GPUs · position 3 in the queue · waiting for capacity: 4 of 4 GPUs in use · 12 s")
    assert "1 GPU ·" in queue_line({"gpus": 1}, 0)


def test_receipt_names_the_costs_the_outcome_and_logical_gpus():
    info = RunInfo(gpus=2, queued_s=1.25, setup_s=0.5, run_s=3.0, gpu_seconds=9.5, released=True,
                   logical_gpus=True, end_reason="finished")
    line = receipt_line(info, None)
    assert line.startswith(
        "done · 2 logical GPUs · queued 1.2 s · setup 0.5 s · run 3.0 s · 9.5 GPU·s · released")
    assert "workers ran on the CPU" in line



def test_a_run_its_user_stopped_reads_interrupted_or_cancelled_and_a_failure_names_its_error():
    info = RunInfo(gpus=2, queued_s=1.25, setup_s=0.5, run_s=3.0, gpu_seconds=9.5, released=True)
    assert receipt_line(info, KeyboardInterrupt()).startswith("interrupted · 2 GPUs · queued 1.2 s")
    assert receipt_line(info, RunCancelled("stopped")).startswith("cancelled · 2 GPUs · queued 1.2 s")
    assert receipt_line(info, WorkerFailed("rank 1 raised")).startswith("failed: WorkerFailed · 2 GPUs")
    assert receipt_line(info, Preempted("by lease 7")).startswith("failed: Preempted · 2 GPUs")
    assert receipt_line(RunInfo(), RunCancelled("stopped")) == "cancelled · nothing was leased"


def test_receipt_of_a_request_that_never_got_gpus_says_nothing_was_leased():
    assert receipt_line(RunInfo(), TimeoutError()) == "failed: TimeoutError · nothing was leased"


def test_series_use_step_when_reported_else_the_report_index():
    history = [{"step": 10, "loss": 1.0, "phase": "warmup"}, {"step": 20, "loss": 0.5, "acc": 0.7}]
    assert metric_series(history) == ("step", {"loss": ([10, 20], [1.0, 0.5]), "acc": ([20], [0.7])})
    assert metric_series([{"loss": 3}, {"loss": 2}]) == ("report", {"loss": ([0, 1], [3.0, 2.0])})


def test_series_leave_out_booleans_text_and_non_finite_values():
    history = [{"loss": float("nan"), "done": True, "name": "x", "lr": 0.1}]
    assert metric_series(history) == ("report", {"lr": ([0], [0.1])})


def test_table_shows_every_key_and_the_last_rows():
    history = [{"step": i, "loss": 1 / (i + 1)} for i in range(12)] + [{"step": 12, "acc": 0.9}]
    columns, rows, hidden = metric_table(history, limit=3)
    assert columns == ["step", "loss", "acc"]
    assert rows == [["10", "0.09091", ""], ["11", "0.08333", ""], ["12", "", "0.9"]]
    assert hidden == 10


def test_table_bundle_escapes_html_and_counts_reports():
    bundle = table_bundle([{"note": "<b>", "loss": 0.5}])
    assert "&lt;b&gt;" in bundle["text/html"] and "<b>" not in bundle["text/html"]
    assert "1 reports" in bundle["text/plain"]


def test_plot_is_a_png_when_there_is_a_number_to_plot():
    assert plot_png([{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]).startswith(b"\x89PNG")
    assert plot_png([{"phase": "warmup"}]) is None


def test_throttle_lets_one_through_per_interval():
    now = [0.0]
    throttle = Throttle(1.0, clock=lambda: now[0])
    assert throttle.due()
    now[0] = 0.5
    assert not throttle.due()
    now[0] = 1.0
    assert throttle.due()


def test_a_loss_falling_by_orders_of_magnitude_is_drawn_on_a_log_axis():
    assert wants_log_scale([20.0, 1.0, 0.01])
    assert not wants_log_scale([1.0, 0.5]) and not wants_log_scale([1.0, 0.0]) and not wants_log_scale([])


def test_restarts_and_resizes_stay_listed_under_the_status_line_with_their_time():
    at = time.mktime((2024, 5, 1, 12, 3, 4, 0, 0, -1))  # local time 12:03:04
    changes = [timed("rank 1 died on n1 (10.0.0.4) (SIGKILL): restarting from the checkpoint after step 3 (attempt 2 of 4)", at),
               timed("preempted by lease 12 (alice, high): 4 -> 2 GPUs from the checkpoint after step 340", at + 60)]
    assert with_changes_text("running on 2 GPUs · step 7 · 3 s", changes).splitlines() == [
        "running on 2 GPUs · step 7 · 3 s",
        "  12:03:04 rank 1 died on n1 (10.0.0.4) (SIGKILL): restarting from the checkpoint after step 3 (attempt 2 of 4)",
        "  12:04:04 preempted by lease 12 (alice, high): 4 -> 2 GPUs from the checkpoint after step 340"]
    assert with_changes_text("running on 2 GPUs", []) == "running on 2 GPUs"  # a run that never changed course
    markup = changes_html(changes + ["<b>"])
    assert "12:04:04 preempted by lease 12" in markup and "&lt;b&gt;" in markup and "<b>" not in markup
    assert changes_html([]) == ""
