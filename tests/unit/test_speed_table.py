"""README's speed tables are rendered from benchmarks/results/*.json (benchmarks/report.py): the
README may show no figure that a results file does not hold."""
from __future__ import annotations

import importlib.util

from ..conftest import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load("report")

MACHINE = {"cores": 2, "loadavg": [3.5, 2.0, 1.0], "python": "3.11.7", "torch": "2.13.0", "ray": "2.60.0",
           "gpusession_commit": "abc1234", "when": "2026-11-25T18:00:00Z"}


def document(**row) -> dict:
    base = {"measure": "warm call", "unit": "s", "gpusession": 0.2, "gpusession_samples": [0.1, 0.2, 0.3],
            "alternative": "Ray Train fit()", "alternative_value": 30.0, "alternative_samples": [29.0, 30.0, 31.0],
            "configured": "max_failures=0", "ratio": 0.0067, "goal": "<= 0.1"}
    return {"benchmark": "call_overhead", "machine": MACHINE, "rows": [{**base, **row}]}


def test_the_readme_speed_tables_are_the_ones_rendered_from_the_results_files():
    rendered = report.render(report.load_results(ROOT / "benchmarks" / "results"),
                             report.benchmark_scripts(ROOT / "benchmarks"))
    difference = report.difference((ROOT / "README.md").read_text(), rendered)
    assert difference == "", f"run `python benchmarks/report.py --write`; README differs:\n{difference}"


def test_a_row_shows_both_medians_with_spread_the_configuration_the_ratio_and_the_machine():
    table = report.render([document()], ["call_overhead"])
    line = next(line for line in table.splitlines() if line.startswith("| `call_overhead.py`"))
    assert "0.2 s (0.1-0.3, n=3)" in line and "30 s (29-31, n=3)" in line
    assert "Ray Train fit(); configured: max_failures=0" in line
    assert "0.0067 (goal: <= 0.1)" in line and "2 cores, load 3.5, 2026-11-25, abc1234" in line
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
