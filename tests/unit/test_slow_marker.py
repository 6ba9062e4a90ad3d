"""The fast loop (`pytest -m "not slow"`) leaves out what starts heavy things of its own, found by
folder and fixture so that new tests there are caught without remembering the marker."""
from __future__ import annotations

from ..conftest import ROOT, SLOW_TESTS, slow_reason


def test_tests_in_the_browser_multihost_hub_and_gpu_folders_are_slow():
    assert slow_reason("e2e", []) and slow_reason("multihost", []) and slow_reason("hub", [])
    assert "CUDA" in slow_reason("gpu", [])


def test_a_test_using_its_own_jupyter_server_or_a_browser_is_slow_wherever_it_lives():
    assert "Jupyter server" in slow_reason("integration", ["cluster", "jp_serverapp"])
    assert "Jupyter server" in slow_reason("integration", ["cluster", "shared_server"])  # one for its module
    assert "browser" in slow_reason("integration", ["page", "browser"])


def test_a_test_on_the_shared_session_cluster_is_not_slow():
    assert slow_reason("integration", ["cluster", "broker", "quiet"]) is None
    assert slow_reason("unit", []) is None


def test_a_test_that_starts_another_users_kernel_or_a_jupyter_kernel_is_slow():
    assert "another user's kernel" in slow_reason("integration", ["cluster", "driver"])
    assert "Jupyter kernel" in slow_reason("integration", ["cluster"], module_names=["pytest", "Kernel"])
    assert "notebook" in slow_reason("integration", ["cluster"], module_names=["NotebookClient"])


def test_listed_files_make_every_test_in_them_slow_and_listed_tests_only_themselves():
    assert "torchrun" in slow_reason("integration", ["cluster"], where="integration/test_torchrun_parity.py::test_x")
    listed = "integration/test_recovery.py::test_a_rank_killed_mid_run_restarts_from_its_checkpoint_and_ends_with_uninterrupted_weights"
    assert "restart" in slow_reason("integration", ["cluster"], where=listed)
    assert slow_reason("integration", ["cluster"], where="integration/test_recovery.py::test_another") is None


def test_every_listed_slow_file_and_test_exists():
    """A renamed test would leave the list silently and join the fast loop: the list must follow."""
    tests = ROOT / "tests"
    for where in SLOW_TESTS:
        file, _, name = where.partition("::")
        assert (tests / file).is_file(), f"tests/conftest.py SLOW_TESTS lists {file}, which does not exist"
        if name:
            assert f"def {name}(" in (tests / file).read_text(), (
                f"tests/conftest.py SLOW_TESTS lists {where}: no such test in {file}; rename the entry")
