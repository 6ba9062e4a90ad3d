"""tests/groups.py's pure parts: the two sessions `.ci/run` starts cover every test folder once."""
from __future__ import annotations

from pathlib import Path

from tests import groups

TESTS = Path(groups.__file__).resolve().parent


def chosen_by(group: groups.Group, folder: str) -> bool:
    """Whether pytest given the group's arguments collects tests/<folder>."""
    ignored = {arg.removeprefix("--ignore=") for arg in group.paths if arg.startswith("--ignore=")}
    chosen = [arg for arg in group.paths if not arg.startswith("--")]
    target = f"tests/{folder}"
    return target not in ignored and any(target == path or target.startswith(path + "/") for path in chosen)


def test_every_test_folder_is_run_by_exactly_one_of_the_two_sessions():
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert {"unit", "integration", "hub", "e2e", "multihost", "shaped", "gpu"} <= set(folders)
    for folder in folders:
        assert [g.name for g in groups.GROUPS if chosen_by(g, folder)] in (["integration"], ["the rest"]), folder


def test_a_sessions_command_is_unbuffered_quiet_pytest_without_its_cache_with_the_callers_arguments_before_the_paths():
    the_rest = groups.GROUPS[1]
    line = groups.command(the_rest, ["-x", "--durations=5"])
    assert line[1:] == ["-u", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--durations=5",
                        "tests", "--ignore=tests/integration"]


def test_only_the_integration_session_gets_a_temporary_folder_of_its_own():
    assert [(g.name, g.own_tmp) for g in groups.GROUPS] == [("integration", True), ("the rest", False)]


def test_the_exit_status_is_zero_only_when_both_sessions_passed_else_the_larger():
    assert groups.combined_status([0, 0]) == 0
    assert groups.combined_status([0, 1]) == 1
    assert groups.combined_status([2, 1]) == 2


def test_the_summary_names_the_session_its_status_its_minutes_and_pytests_last_line():
    line = groups.summary_line(groups.GROUPS[0], 0, 754.48, "309 passed in 754.48s (0:12:34)")
    assert line == "integration: exit status 0 after 12:34 (309 passed in 754.48s (0:12:34))"
    assert groups.summary_line(groups.GROUPS[1], 1, 59.6, "== 1 failed, 3 passed in 59.60s ==") == \
        "the rest: exit status 1 after 1:00 (1 failed, 3 passed in 59.60s)"
    assert groups.summary_line(groups.GROUPS[1], 4, 1.0, "").endswith("(no output)")


def test_the_summary_keeps_pytests_result_line_over_a_warning_printed_after_it():
    warning = "2026-11-30 20:10:23,126\tWARNING worker.py:1681 -- SIGTERM handler is not set\n"
    kept = ""
    for line in ("collecting ...\n", "1167 passed, 9 skipped in 737.42s (0:12:17)\n", "\n", warning):
        kept = groups.kept_line(kept, line)
    assert kept == "1167 passed, 9 skipped in 737.42s (0:12:17)"
    assert groups.kept_line("", warning) == warning.rstrip("\n")  # no result yet: the last line said


def test_pytests_result_line_is_told_from_a_warning_printed_after_it():
    assert groups.is_result("1167 passed, 9 skipped in 737.42s (0:12:17)")
    assert groups.is_result("== 1 failed, 3 passed in 59.60s ==") and groups.is_result("no tests ran in 0.01s")
    assert groups.is_result("1480 tests collected in 3.21s")
    assert not groups.is_result("2026-11-30 20:10:23,126\tWARNING worker.py:1681 -- SIGTERM handler is not set "
                                "because current thread is not the main thread.")
