"""The status line on top of a run's output: its words in every phase, seconds that keep
counting without events, borrowed GPUs said while running and in the receipt, no emoji; a
terminal's log keeps each restart line."""
from __future__ import annotations

import io

from gpusession.observe.console import ConsoleObserver
from gpusession.observe.events import RunInfo
from gpusession.observe.receipt import receipt_text
from gpusession.observe.statusline import BORROWED, Phase, Status, status_html, status_text, step_of

QUEUE_VIEW = {"position": 2, "reason": "waiting for capacity: 4 of 4 GPUs in use"}


def lines_of_a_whole_run() -> list[str]:
    asking = Status(Phase.ASKING, 100.0, gpus=2, workers=2)
    queued = asking.moved(Phase.QUEUED, 100.0, view=QUEUE_VIEW)
    starting = queued.moved(Phase.STARTING, 130.0, nodes=1)
    running = starting.moved(Phase.RUNNING, 134.0, step=12)
    changing = running.moved(Phase.CHANGING, 140.0, line="rank 1 died on node 10.0.0.4 (SIGKILL): "
                                                         "restarting from the checkpoint after step 12 (attempt 2 of 4)")
    info = RunInfo(gpus=2, queued_s=30, setup_s=4, run_s=9, gpu_seconds=26, released=True)
    done = changing.moved(Phase.DONE, 150.0, line=receipt_text(info, None))
    return [status_text(asking, 100.9), status_text(queued, 112.2), status_text(starting, 133.1),
            status_text(running, 141.0), status_text(changing, 145.0), status_text(done, 500.0)]


def test_every_phase_has_its_own_words_and_its_seconds():
    assert lines_of_a_whole_run() == [
        "asking the cluster for 2 GPUs · 1 s",
        "waiting for 2 GPUs · position 2 in the queue · waiting for capacity: 4 of 4 GPUs in use · 12 s",
        "starting 2 workers on 1 node (3 s)",
        "running on 2 GPUs · step 12 · 7 s",
        "rank 1 died on node 10.0.0.4 (SIGKILL): restarting from the checkpoint after step 12 (attempt 2 of 4) (5 s)",
        "done · 2 GPUs · queued 30.0 s · setup 4.0 s · run 9.0 s · 26.0 GPU·s · released",
    ]


def test_the_line_keeps_counting_while_no_event_comes():
    starting = Status(Phase.STARTING, 10.0, workers=2, nodes=1)
    assert [status_text(starting, now) for now in (10.2, 13.0, 21.6)] == [
        "starting 2 workers on 1 node (0 s)", "starting 2 workers on 1 node (3 s)",
        "starting 2 workers on 1 node (12 s)"]


def test_no_line_is_ever_blank_and_none_needs_an_emoji_font():
    for line in lines_of_a_whole_run():
        assert line.strip()
        assert all(ord(char) < 0x2190 for char in line), line  # Latin, punctuation, the middle dot


def test_a_run_on_borrowed_gpus_says_so_while_it_runs_and_in_its_receipt():
    running = Status(Phase.RUNNING, 0.0, gpus=3, borrowed=True)
    assert status_text(running, 5.0) == f"running on 3 GPUs · 5 s · {BORROWED}"
    assert "preempted first" in status_html(running, 5.0)
    info = RunInfo(gpus=3, over_quota=True, released=True)
    assert "on borrowed GPUs (over quota)" in receipt_text(info, None)


def test_a_terminal_gets_the_line_without_seconds():
    assert status_text(Status(Phase.STARTING, 0.0, workers=4, nodes=2), None) == "starting 4 workers on 2 nodes"


def test_a_terminal_keeps_each_restart_line_in_its_log_and_the_receipt_counts_it():
    err = io.StringIO()
    console = ConsoleObserver(2, stdout=io.StringIO(), stderr=err)
    info = RunInfo(gpus=2, workers=2, released=True)
    restart = "rank 1 died on n1 (10.0.0.4) (SIGKILL): restarting from the checkpoint after step 3 (attempt 2 of 4)"
    console.granted(info)
    console.running(info)
    info.restarts, info.steps_lost = 1, 2
    console.transition(info, restart)
    console.running(info)
    console.finished(info, None)
    lines = err.getvalue().splitlines()
    assert lines[:2] == ["gpusession: starting 2 workers on 1 node", "gpusession: running on 2 GPUs"]
    assert lines[2:4] == [f"gpusession: {restart}", "gpusession: running on 2 GPUs"]
    assert lines[4].startswith("gpusession: done · 2 GPUs") and "1 restart · 2 steps lost" in lines[4]


def test_the_html_line_escapes_the_controllers_words_and_tags_the_phase():
    changing = Status(Phase.CHANGING, 0.0, line="resize to <2> workers")
    markup = status_html(changing, 1.0)
    assert "&lt;2&gt;" in markup and "data-phase='changing'" in markup
    failed = status_html(Status(Phase.DONE, 0.0, line="failed: WorkerFailed · 2 GPUs", failed=True), 0.0)
    assert ">failed<" in failed and ">WorkerFailed · 2 GPUs<" in failed  # the tag says failed, once
    stopped = status_html(Status(Phase.DONE, 0.0, line="interrupted · 2 GPUs", stopped=True), 0.0)
    assert ">stopped<" in stopped and ">interrupted · 2 GPUs<" in stopped and "failed" not in stopped


def test_a_resize_is_tagged_resizing_and_a_restart_restarting():
    resizing = status_html(Status(Phase.CHANGING, 0.0, line="preempted by lease 12 (alice, high): 4 -> 2 GPUs "
                                                             "from the checkpoint after step 340"), 1.0)
    restarting = status_html(Status(Phase.CHANGING, 0.0, line="rank 1 died on n (SIGKILL): restarting from "
                                                               "the checkpoint after step 5 (attempt 2 of 4)"), 1.0)
    assert ">resizing<" in resizing and ">restarting<" in restarting


def test_the_running_line_shows_the_last_reported_step_else_the_report_count():
    assert step_of([]) is None
    assert step_of([{"step": 3, "loss": 1.0}, {"step": 7}]) == 7
    assert step_of([{"loss": 1.0}, {"loss": 0.5}]) == 2
