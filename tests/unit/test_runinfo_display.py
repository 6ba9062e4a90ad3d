"""RunInfo shows itself as a short receipt with a summarised history (text and HTML), while
`history` keeps every report."""
from __future__ import annotations

from IPython.lib.pretty import pretty

from gpusession.events import RunInfo


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
