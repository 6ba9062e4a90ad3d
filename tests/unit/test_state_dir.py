"""Each cluster's broker state (ledger, admin token, identity key) in a directory of its own, even
when the users of two clusters share a home: the choice of directory, with real files and locks."""
from __future__ import annotations

import pytest

from gpusession.broker.storage import statedir


def test_two_clusters_on_one_host_sharing_a_home_get_two_directories(tmp_path):
    first = statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=None)
    second = statedir.claim(tmp_path, host="gpu-a", port=6380, recorded=None)
    assert first.directory == tmp_path / "clusters" / "gpu-a"
    assert second.directory == tmp_path / "clusters" / "gpu-a-6380"
    assert first.db_path != second.db_path


def test_clusters_on_two_hosts_sharing_a_home_get_a_directory_per_host(tmp_path):
    one = statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=None)
    other = statedir.claim(tmp_path, host="gpu-b", port=6379, recorded=None)
    assert (one.directory.name, other.directory.name) == ("gpu-a", "gpu-b")


def test_a_restarted_broker_comes_back_to_its_directory_once_its_predecessor_has_exited(tmp_path):
    first = statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=None)
    other = statedir.claim(tmp_path, host="gpu-a", port=6380, recorded=None)  # another cluster meanwhile
    recorded = statedir.relative(tmp_path, first.directory)
    with pytest.raises(statedir.StateDirTaken, match="still held by another broker"):
        statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=recorded, wait_s=0.2)
    first.release()  # the old broker's process exited
    again = statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=recorded, wait_s=0.2)
    assert again.directory == first.directory != other.directory


def test_a_new_head_on_the_same_host_carries_on_with_its_ledger(tmp_path):
    """`gpusession cluster start` picks a new port each time: the host's directory is still its."""
    statedir.claim(tmp_path, host="gpu-a", port=41000, recorded=None).release()
    assert statedir.claim(tmp_path, host="gpu-a", port=52000, recorded=None).directory.name == "gpu-a"


def test_a_ledger_from_before_stays_with_the_first_host_that_starts_and_no_other(tmp_path):
    (tmp_path / "ledger.db").write_text("old books")
    adopted = statedir.claim(tmp_path, host="gpu-a", port=6379, recorded=None)
    assert adopted.directory == tmp_path and (tmp_path / "ledger.db.owner").read_text().strip() == "gpu-a"
    adopted.release()
    assert statedir.claim(tmp_path, host="gpu-b", port=6379, recorded=None).directory.name == "gpu-b"
    assert statedir.claim(tmp_path, host="gpu-a", port=7000, recorded=None).directory == tmp_path


def test_host_names_become_safe_directory_names():
    assert statedir.host_key("node/1 ..x") == "node_1_..x"
    assert statedir.host_key("") == "host"
