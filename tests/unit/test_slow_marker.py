"""The fast loop (`pytest -m "not slow"`) leaves out what starts heavy things of its own, found by
folder and fixture so that new tests there are caught without remembering the marker."""
from __future__ import annotations

from ..conftest import slow_reason


def test_tests_in_the_browser_multihost_and_hub_folders_are_slow():
    assert slow_reason("e2e", []) and slow_reason("multihost", []) and slow_reason("hub", [])


def test_a_test_using_its_own_jupyter_server_or_a_browser_is_slow_wherever_it_lives():
    assert "Jupyter server" in slow_reason("integration", ["cluster", "jp_serverapp"])
    assert "browser" in slow_reason("integration", ["page", "browser"])


def test_a_test_on_the_shared_session_cluster_is_not_slow():
    assert slow_reason("integration", ["cluster", "broker", "quiet"]) is None
    assert slow_reason("unit", []) is None
