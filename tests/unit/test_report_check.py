"""`report.py --check --strict` refuses what a maintainer would: a row older than the code it
measures, measured on uncommitted code, derived from newer or refused results, or missing its goal
with nothing beside it saying why, or fewer than 5 samples a side with nothing saying why
(benchmarks/_freshness.py decides; these feed it such rows)."""
from __future__ import annotations

import pytest

from .test_speed_table import MACHINE, document, load

freshness = load("_freshness")
report = load("report")
RowFacts, Refusal = freshness.RowFacts, freshness.Refusal

FRESH = RowFacts("abc1234", changes_since=())


def refusals(row: dict, facts) -> list:
    return [finding.refusal for finding in freshness.judge(row, facts)]


def strict_status(doc: dict, facts) -> int:
    """--check --strict's exit status for a page that shows exactly the rendered tables."""
    rendered = report.render([doc], [], facts)
    page = f"{report.BEGIN}\n{rendered}\n{report.END}\n"
    refused = freshness.refused_summary(report.findings_by_row([doc], facts))
    return report.check(page, rendered, refused, strict=True)[0]


def test_a_row_measured_at_the_last_change_of_its_code_stands():
    assert refusals(document()["rows"][0], FRESH) == []
    assert strict_status(document(), {("call_overhead", 0): FRESH}) == 0


def test_a_row_older_than_a_change_to_its_code_is_stale_since_the_first_change():
    facts = RowFacts("abc1234", changes_since=("1111111", "2222222"))
    found = freshness.judge(document()["rows"][0], facts)
    assert [f.refusal for f in found] == [Refusal.STALE]
    assert found[0].mark == "stale since 1111111: re-measure"
    assert strict_status(document(), {("call_overhead", 0): facts}) == 1


def test_a_dirty_commit_is_refused_even_with_no_change_since():
    facts = RowFacts("abc1234+dirty", changes_since=())
    assert refusals(document()["rows"][0], facts) == [Refusal.DIRTY]
    assert strict_status(document(), {("call_overhead", 0): facts}) == 1


def test_a_commit_missing_from_the_history_or_unrecorded_is_refused():
    assert refusals(document()["rows"][0], RowFacts("deadbee", changes_since=None)) == [Refusal.UNKNOWN_COMMIT]
    assert refusals(document()["rows"][0], RowFacts(None)) == [Refusal.UNKNOWN_COMMIT]


def test_a_missed_goal_without_a_goal_note_is_refused_and_a_note_beside_it_lets_it_stand():
    missed = document(ratio=0.5, goal="<= 0.1")["rows"][0]
    assert refusals(missed, FRESH) == [Refusal.GOAL_MISSED_UNEXPLAINED]
    assert strict_status(document(ratio=0.5, goal="<= 0.1"), {("call_overhead", 0): FRESH}) == 1
    explained = {**missed, "goal_note": "measured at load 40; re-measure on a quiet machine"}
    assert refusals(explained, FRESH) == []


@pytest.mark.parametrize(("mine", "theirs"), [([0.1, 0.2, 0.3], [29.0] * 5), ([0.1] * 5, [29.0, 31.0]), ([0.2], [])])
def test_fewer_than_five_samples_on_a_side_are_refused_unless_a_samples_note_says_why(mine, theirs):
    doc = document(gpusession_samples=mine, alternative_samples=theirs)
    assert refusals(doc["rows"][0], FRESH) == [Refusal.FEW_SAMPLES_UNEXPLAINED]
    assert strict_status(doc, {("call_overhead", 0): FRESH}) == 1
    explained = document(gpusession_samples=mine, alternative_samples=theirs,
                         samples_note="each sample waits out Ray's 64 s health check")
    assert refusals(explained["rows"][0], FRESH) == []
    assert "(each sample waits out Ray's 64 s health check)" in report.measured_line(explained, explained["rows"][0])


def test_a_side_without_samples_is_not_counted_as_few():
    no_alternative = document(alternative="", alternative_value=None, alternative_samples=[], ratio=None, goal="")
    assert refusals(no_alternative["rows"][0], FRESH) == []


def test_the_table_says_missed_beside_the_goal_with_its_note_or_unexplained():
    assert "0.5 (goal: <= 0.1; MISSED, unexplained)" in report.ratio_cell({"ratio": 0.5, "goal": "<= 0.1"})
    noted = report.ratio_cell({"ratio": 0.5, "goal": "<= 0.1", "goal_note": "fresh processes per call"})
    assert noted == "0.5 (goal: <= 0.1; missed: fresh processes per call)"


@pytest.mark.parametrize(("goal", "row", "met"), [
    ("<= 0.10", {"ratio": 0.0255, "gpusession": 0.99, "unit": "s"}, True),   # unitless: the ratio
    ("<= 0.2 s (SPEC)", {"ratio": 0.0255, "gpusession": 0.99, "unit": "s"}, False),  # a unit: gpusession's figure
    ("< 10 ms, and no slower than without", {"gpusession": 164.0, "unit": "ms", "ratio": 2.17}, False),
    ("< 1.5 s", {"gpusession": 106.6, "unit": "ms"}, True),                 # converted from the row's unit
    (">= 500", {"gpusession": 223.2, "unit": "/s", "ratio": None, "alternative_value": None}, False),
    (">= 0.9", {"gpusession": 0.9179, "unit": "", "ratio": None, "alternative_value": None}, True),
    ("<= 1 s", {"gpusession": 3.0, "unit": "samples/s"}, None),             # a time bound on a rate: unreadable
    ("fair by Ray's docs", {"ratio": 9.0}, None),                            # free text: not judged
])
def test_a_goal_bounds_the_ratio_or_with_a_time_unit_gpusessions_figure(goal, row, met):
    assert freshness.goal_met(goal, row) is met


def test_a_derived_file_is_refused_when_an_input_was_measured_after_it_used_it():
    used = {"call_overhead": "2026-11-25T10:00:00Z", "elastic": "2026-11-25T09:00:00Z"}
    now = {"call_overhead": "2026-11-28T10:00:00Z", "elastic": "2026-11-25T09:00:00Z"}
    assert freshness.newer_inputs("2026-11-25T11:00:00Z", used, now) == ("call_overhead",)
    assert freshness.newer_inputs("2026-11-25T11:00:00Z", used, used) == ()
    # an older file that did not record what it used: an input newer than the file itself counts
    assert freshness.newer_inputs("2026-11-26T00:00:00Z", None, now) == ("call_overhead",)
    facts = RowFacts("abc1234", changes_since=(), newer_inputs=("call_overhead",))
    assert refusals(document()["rows"][0], facts) == [Refusal.DERIVED_FROM_NEWER]


def test_a_derived_file_of_refused_inputs_is_refused_too():
    facts = RowFacts("abc1234", changes_since=(), refused_inputs=("elastic",))
    found = freshness.judge(document()["rows"][0], facts)
    assert [f.refusal for f in found] == [Refusal.DERIVED_FROM_REFUSED] and "elastic" in found[0].mark


def test_plain_check_passes_a_page_showing_its_stale_rows_and_strict_fails_it():
    stale = {("call_overhead", 0): RowFacts("abc1234", changes_since=("1111111",))}
    rendered = report.render([document()], [], stale)
    assert "**stale since 1111111: re-measure**" in rendered
    page = f"{report.BEGIN}\n{rendered}\n{report.END}\n"
    refused = freshness.refused_summary(report.findings_by_row([document()], stale))
    assert report.check(page, rendered, refused, strict=False)[0] == 0
    status, text = report.check(page, rendered, refused, strict=True)
    assert status == 1 and "call_overhead: warm call (against Ray Train fit()): stale since 1111111" in text
    hidden = report.render([document()], [])  # a page that hides the finding differs from the rendering
    assert report.check(f"{report.BEGIN}\n{hidden}\n{report.END}\n", rendered, refused, strict=False)[0] == 1


def test_the_load_at_start_and_at_end_are_shown():
    started = {**MACHINE, "loadavg_at_start": [1.25, 1.0, 1.0]}
    assert "load 1.2 at start, 3.5 at end" in report.machine_cell(started)
    assert "load 3.5," in report.machine_cell(MACHINE)


def test_a_row_marked_simulated_goes_to_the_simulated_table_and_its_file_mates_stay_measured():
    doc = document()
    doc["rows"].append({**doc["rows"][0], "measure": "sleeps as GPU time", "simulated": True})
    measured, simulated = report.render([doc], []).split("Simulated", 1)
    assert ": warm call |" in measured and "sleeps as GPU time" not in measured
    assert "sleeps as GPU time" in simulated


def test_every_path_a_script_is_said_to_measure_exists():
    from ..conftest import ROOT

    named = set(freshness.DEFAULT_MEASURES) | {path for paths in freshness.EXTRA_MEASURES.values() for path in paths}
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py")}
    assert set(freshness.EXTRA_MEASURES) <= scripts


def test_a_measure_set_against_two_alternatives_is_judged_row_by_row():
    # one measure, two rows: the first misses its goal, the second meets its own; the miss must not
    # be hidden behind the second row of the same name
    doc = document(goal="<= 0.1 s (SPEC)")
    doc["rows"].append({**doc["rows"][0], "alternative": "a long-lived pool", "alternative_value": 0.01,
                        "ratio": 20.0, "goal": "<= 30"})
    facts = {("call_overhead", 0): FRESH, ("call_overhead", 1): FRESH}
    refused = freshness.refused_summary(report.findings_by_row([doc], facts))
    assert refused == ["call_overhead: warm call (against Ray Train fit()): goal missed, no goal_note says why"]
    assert strict_status(doc, facts) == 1


def test_every_results_file_names_at_least_what_its_script_is_said_to_measure():
    # a results file's own list is what --check judges it by: a path added to EXTRA_MEASURES (the hub's
    # gateway and launcher, which run in processes of their own) must reach the files already written
    import json

    from ..conftest import ROOT

    short = {}
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        if "measures" in doc:
            script = doc.get("script") or doc["benchmark"]
            missing = set(freshness.EXTRA_MEASURES.get(script, ())) - set(doc["measures"])
            if missing:
                short[path.name] = sorted(missing)
    assert short == {}
