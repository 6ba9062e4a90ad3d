"""RunInfo shows itself as a short receipt with a summarised history (text and HTML), while
`history` keeps every report; it says where the ranks ran and how the run changed course."""
from __future__ import annotations

from IPython.lib.pretty import pretty

from gpusession.observe.events import RunInfo
from gpusession.observe.receipt import ranks_on_hosts
from gpusession.run.caller.controller import _reset_run_fields


def a_long_run() -> RunInfo:
    history = [{"step": i, "loss": 1 / (i + 3), "note": "<b>"} for i in range(100)]
    return RunInfo(lease_id=7, gpus=2, logical_gpus=True, queued_s=0.04, setup_s=3.2, run_s=12.0,
                   gpu_seconds=30.5, history=history, end_reason="finished", released=True)


def test_repr_is_one_line_with_the_receipt_not_the_reports():
    text = repr(a_long_run())
    assert text == ("<RunInfo (lease 7, finished): 2 logical GPUs · queued 0.0 s · setup 3.2 s · run 12.0 s · "
                    "30.5 GPU·s · released; 100 reports>")


def test_pretty_text_summarises_the_history_as_first_and_last_rows_rounded():
    lines = pretty(a_long_run()).splitlines()
    assert lines[1] == "history: 100 reports, first 3 and last 4 shown; all of them in .history"
    assert lines[2].split() == ["#", "step", "loss", "note"]
    assert lines[3].split() == ["0", "0", "0.3333", "<b>"]
    assert lines[6].strip() == "…"
    assert lines[-1].split() == ["99", "99", "0.009804", "<b>"]
    assert len(lines) == 2 + 1 + 3 + 1 + 4


def test_html_is_a_receipt_and_a_summarised_escaped_table():
    markup = a_long_run()._repr_html_()
    assert markup.count("<tr>") == 1 + 3 + 1 + 4 and "&lt;b&gt;" in markup and "<b>" not in markup
    assert "100 reports" in markup


def test_history_stays_the_full_list():
    info = a_long_run()
    pretty(info), repr(info), info._repr_html_()
    assert len(info.history) == 100 and info.history[42] == {"step": 42, "loss": 1 / 45, "note": "<b>"}


def test_a_short_history_is_shown_whole_and_an_empty_one_says_so():
    short = RunInfo(gpus=1, history=[{"loss": 0.5}])
    assert pretty(short).splitlines()[1] == "history: 1 report; all of them in .history"
    assert "no reports" in pretty(RunInfo())


def a_restarted_run_on_two_hosts() -> RunInfo:
    return RunInfo(lease_id=9, gpus=4, workers=4, queued_s=0.0, setup_s=2.0, run_s=30.0, gpu_seconds=130.0,
                   restarts=1, resizes=1, steps_lost=3, end_reason="finished", released=True,
                   rank_hosts={0: "host1 (10.0.0.11)", 1: "host1 (10.0.0.11)", 2: "host2 (10.0.0.12)",
                               3: "host2 (10.0.0.12)"},
                   transitions=["rank 3 died on host2 (10.0.0.12) (SIGKILL): restarting from the checkpoint after step 120 "
                                "(attempt 2 of 4)", "4 GPUs again at step 610"])


def test_the_receipt_names_each_hosts_ranks_and_counts_restarts_resizes_and_steps_lost():
    assert a_restarted_run_on_two_hosts().receipt() == (
        "4 GPUs · queued 0.0 s · setup 2.0 s · run 30.0 s · 130.0 GPU·s · 1 restart · 1 resize · 3 steps lost · "
        "ranks 0-1 on host1 (10.0.0.11), 2-3 on host2 (10.0.0.12) · released")


def test_a_receipt_on_one_host_stays_as_short_as_before():
    info = RunInfo(gpus=2, workers=2, rank_hosts={0: "laptop (127.0.0.1)", 1: "laptop (127.0.0.1)"}, released=True)
    assert info.receipt() == "2 GPUs · queued 0.0 s · setup 0.0 s · run 0.0 s · 0.0 GPU·s · released"


def test_the_display_says_where_the_ranks_ran_and_lists_each_restart_and_resize():
    lines = pretty(a_restarted_run_on_two_hosts()).splitlines()
    assert "ranks 0-1 on host1" not in lines[0]  # said once, on its own line
    assert lines[1] == "ran on: ranks 0-1 on host1 (10.0.0.11), 2-3 on host2 (10.0.0.12)"
    assert lines[2:5] == ["restarts and resizes:",
                          "  rank 3 died on host2 (10.0.0.12) (SIGKILL): restarting from the checkpoint after step 120 (attempt 2 of 4)",
                          "  4 GPUs again at step 610"]
    markup = a_restarted_run_on_two_hosts()._repr_html_()
    assert "ran on: ranks 0-1 on host1 (10.0.0.11)" in markup and "4 GPUs again at step 610" in markup
    laptop = RunInfo(gpus=1, workers=1, rank_hosts={0: "laptop (127.0.0.1)"})
    assert pretty(laptop).splitlines()[1] == "ran on: rank 0 on laptop (127.0.0.1)"


def test_a_run_that_shrank_shows_only_the_ranks_it_has_now():
    info = a_restarted_run_on_two_hosts()
    info.workers = 2  # host2 was lost; the run went on with ranks 0-1
    assert "host2" not in info.receipt() and pretty(info).splitlines()[1] == "ran on: ranks 0-1 on host1 (10.0.0.11)"


def test_ranks_that_are_not_contiguous_read_as_ranges_per_host():
    assert ranks_on_hosts({0: "a", 1: "a", 2: "a", 5: "a", 3: "b", 4: "b"}) == "ranks 0-2,5 on a, 3-4 on b"
    assert ranks_on_hosts({0: "a", 1: "b"}) == "rank 0 on a, 1 on b"
    assert ranks_on_hosts({}) == ""


def test_a_later_run_of_a_held_lease_starts_with_no_ranks_hosts_or_restarts_of_the_earlier_one():
    info = a_restarted_run_on_two_hosts()
    _reset_run_fields(info, None)
    assert (info.rank_hosts, info.transitions, info.restarts, info.steps_lost) == ({}, [], 0, 0)
