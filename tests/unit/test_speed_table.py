"""docs/speed.md's speed tables are rendered from benchmarks/results/*.json (benchmarks/report.py):
the page may show no figure that a results file does not hold, and shows every row that cannot
stand as a current claim as such."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from ..conftest import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


report = load("report")

MACHINE = {"cores": 2, "loadavg": [3.5, 2.0, 1.0], "python": "3.11.7", "torch": "2.13.0", "ray": "2.60.0",
           "gpusession_commit": "abc1234", "when": "2026-11-25T18:00:00Z"}


def document(**row) -> dict:
    base = {"measure": "warm call", "unit": "s", "gpusession": 0.2, "gpusession_samples": [0.1, 0.15, 0.2, 0.25, 0.3],
            "alternative": "Ray Train fit()", "alternative_value": 30.0,
            "alternative_samples": [29.0, 29.5, 30.0, 30.5, 31.0],
            "configured": "max_failures=0", "ratio": 0.0067, "goal": "<= 0.1"}
    return {"benchmark": "call_overhead", "machine": MACHINE, "rows": [{**base, **row}]}


def live_tables():
    git_facts = load("_git_facts")
    if not git_facts.git_available():
        pytest.skip("a copy of the checkout without git history: no commit can be judged")
    documents = report.load_results(ROOT / "benchmarks" / "results")
    facts = git_facts.facts_for(documents)
    return documents, facts, report.render(documents, report.benchmark_scripts(ROOT / "benchmarks"), facts)


def test_the_speed_page_tables_are_the_ones_rendered_from_the_results_files_and_their_history():
    _, _, rendered = live_tables()
    difference = report.difference((ROOT / "docs" / "speed.md").read_text(), rendered)
    assert difference == "", f"run `python benchmarks/report.py --write`; docs/speed.md differs:\n{difference}"


def test_every_refused_row_of_the_speed_page_is_shown_refused_on_its_line():
    documents, facts, rendered = live_tables()
    page = report.current_block((ROOT / "docs" / "speed.md").read_text()).splitlines()
    seen: dict[str, int] = {}
    for document in documents:
        for index, row in enumerate(document["rows"]):
            found = report.judge(row, facts[(document["benchmark"], index)])
            start = f"| `{report.script_name(document)}.py`: {row['measure']}"
            lines = [line for line in page if line.startswith((start + " |", start + " ("))]
            line = lines[seen.get(start, 0)]  # rows of one measure (gpu_check's two cards) in file order
            seen[start] = seen.get(start, 0) + 1
            for finding in found:
                shown = "MISSED, unexplained" if finding.refusal is report.Refusal.GOAL_MISSED_UNEXPLAINED \
                    else finding.mark
                assert shown in line, f"{document['benchmark']}: {row['measure']} hides {finding.refusal.value}"


def test_a_row_shows_both_medians_with_spread_the_configuration_the_ratio_and_the_machine():
    table = report.render([document()], ["call_overhead"])
    line = next(line for line in table.splitlines() if line.startswith("| `call_overhead.py`"))
    assert "0.2 s (0.1-0.3, n=5)" in line and "30 s (29-31, n=5)" in line
    assert "Ray Train fit(); configured: max_failures=0" in line
    assert "0.0067 (goal: <= 0.1)" in line and "2 cores, load 3.5, 2026-11-25, abc1234" in line
    assert "**" not in line  # judged by nobody: no findings shown
    assert "not re-measured" not in table


def test_a_configuration_the_row_above_states_is_not_repeated():
    two = document()
    two["rows"].append({**two["rows"][0], "measure": "first call"})
    first, second = [line for line in report.render([two], []).splitlines() if line.startswith("| `call")]
    assert "configured: max_failures=0" in first and "configured: as above" in second


def test_an_alternative_that_cannot_shows_cannot_and_no_ratio():
    table = report.render([document(alternative_value="cannot", alternative_samples=[], ratio=None)], [])
    line = table.splitlines()[-1]
    assert "| cannot | cannot (goal: <= 0.1) |" in line


def test_a_simulation_goes_to_its_own_table_and_a_script_without_results_says_since_when():
    simulated = {**document(), "benchmark": "utilization_replay", "simulated": True}
    table = report.render([simulated], ["utilization_replay", "sweep"])
    measured, simulated_part = table.split("Simulated", 1)
    assert "`utilization_replay.py`" in simulated_part and "`utilization_replay.py`" not in measured
    assert f"| `sweep.py` | not re-measured since {report.NOT_REMEASURED_SINCE} |" in measured


def test_check_reports_a_changed_figure_and_a_missing_table():
    rendered = report.render([document()], [])
    readme = f"intro\n{report.BEGIN}\n{rendered}\n{report.END}\nrest\n"
    assert report.difference(readme, rendered) == ""
    edited = readme.replace("0.2 s (0.1", "0.1 s (0.1")
    assert "-| `call_overhead.py`" in report.difference(edited, rendered)
    assert "no speed tables" in report.difference("intro only\n", rendered)
    assert report.with_block(edited, rendered) == readme


def test_a_second_results_file_of_one_script_renders_under_the_scripts_name_with_each_rows_own_machine():
    later = {**MACHINE, "loadavg": [7.25, 1.0, 1.0], "when": "2026-11-27T11:00:00Z"}
    tuned = {**document(note="Ray's health check tuned", machine=later), "benchmark": "multihost-tuned",
             "script": "multihost"}
    table = report.render([tuned], ["multihost"])
    line = next(line for line in table.splitlines() if line.startswith("| `multihost.py`: warm call"))
    assert "(Ray's health check tuned)" in line and "load 7.2, 2026-11-27" in line
    assert "multihost-tuned.py" not in table and "not re-measured" not in table


results = load("_results")


def test_a_part_measured_again_replaces_its_row_and_the_other_parts_keep_theirs_with_their_machine():
    old = {"command": "python benchmarks/multihost.py --node-loss cut", "machine": MACHINE,
           "rows": [{"measure": "cut", "gpusession": 6.0}, {"measure": "kill", "gpusession": 1.0}]}
    rows = results.merged(old, [{"measure": "kill", "gpusession": 0.8, "machine": {"cores": 4}},
                                {"measure": "move", "gpusession": 1.2, "machine": {"cores": 4}}])
    assert [(r["measure"], r["gpusession"]) for r in rows] == [("cut", 6.0), ("kill", 0.8), ("move", 1.2)]
    assert rows[0]["machine"] == MACHINE and rows[0]["command"].endswith("--node-loss cut")
    assert rows[1]["machine"] == {"cores": 4}
    assert results.merged(None, rows[1:]) == rows[1:]
