"""The no-silent-skip rule (tests/skiplist.py) on plain values: which skips fail a CI run."""
from __future__ import annotations

import pytest

from ..skiplist import LIST, Allowed, Skipped, enforced, load, report, unexplained

GPU = Allowed("gpu/*", "no CUDA on this machine")


def test_a_listed_test_skipped_for_its_listed_reason_is_explained():
    skipped = [Skipped("gpu/test_gpu.py::test_nccl_at_one_rank", "no CUDA on this machine (torch sees 0 GPUs)")]
    assert unexplained(skipped, [GPU]) == []


def test_an_unlisted_skip_or_a_listed_test_skipped_for_another_reason_is_unexplained():
    other = Skipped("multihost/test_node_loss.py::test_a_lost_host", "simulated hosts need root")
    wrong_reason = Skipped("gpu/test_gpu.py::test_two_leases", "flaky today")
    assert unexplained([other, wrong_reason], [GPU]) == [other, wrong_reason]


def test_a_pattern_matches_whole_ids_only():
    assert unexplained([Skipped("unit/gpu/test_x.py::t", "no CUDA on this machine")], [GPU]) != []
    assert unexplained([Skipped("gpu/test_x.py::t[2]", "no CUDA on this machine")], [GPU]) == []


@pytest.mark.parametrize("env, uid, expected", [
    ({"CI": "true"}, 0, True), ({"CI": "1"}, 0, True), ({"CI": "true"}, 1000, False), ({}, 0, False),
    ({"CI": "false"}, 0, False),
])
def test_skips_fail_the_run_only_in_ci_as_root(env, uid, expected):
    assert enforced(env, uid) is expected


def test_the_report_names_each_unexplained_test_its_reason_and_the_file_to_list_it_in():
    text = report([Skipped("shaped/test_shaped_link.py::test_x", "cannot create a network namespace")])
    assert "1 test(s) skipped" in text and "tests/expected_skips.toml" in text
    assert "shaped/test_shaped_link.py::test_x: cannot create a network namespace" in text


def test_an_entry_without_a_reason_is_refused_naming_it():
    with pytest.raises(ValueError, match="entry 1 needs both `tests`.*and `reason`"):
        load('[[skip]]\ntests = "gpu/*"\n')


def test_the_projects_list_loads_and_allows_the_gpu_tests_on_a_machine_without_cuda():
    allowed = load(LIST.read_text())
    assert all(a.reason for a in allowed)
    assert unexplained([Skipped("gpu/test_gpu.py::test_nccl_at_one_rank", "no CUDA on this machine")], allowed) == []
