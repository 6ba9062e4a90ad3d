"""tests/raysessions.py: where Ray puts its session folders, and which of them the test session
removes at its end (new since its start, no file open in them, never through a link)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import raysessions


@pytest.mark.parametrize("env", [{}, {"TMPDIR": "/var/tmp/x"}, {"RAY_TMPDIR": "/srv/r", "TMPDIR": "/var/tmp/x"}])
def test_the_root_is_the_one_ray_itself_uses(monkeypatch, env):
    from ray._common.utils import get_default_ray_temp_dir

    for name in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert str(raysessions.ray_temp_root()) == get_default_ray_temp_dir()


def test_only_new_folders_no_process_has_a_file_open_in_go_and_never_through_a_link(tmp_path):
    root = tmp_path / "ray"
    old = root / "session_2026-11-30_10-00-00_000001_11"
    old.mkdir(parents=True)
    elsewhere = tmp_path / "not-ray"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("someone's")
    snapshot = raysessions.Snapshot.now({"RAY_TMPDIR": str(tmp_path)})
    ended = root / "session_2026-11-30_11-00-00_000002_22"
    (ended / "logs").mkdir(parents=True)
    (ended / "logs" / "raylet.out").write_text("done")
    live = root / "session_2026-11-30_12-00-00_000003_33"
    (live / "logs").mkdir(parents=True)
    (root / "session_2026-11-30_13-00-00_000004_44").symlink_to(elsewhere)  # a link named like one
    (root / "session_latest").symlink_to(ended)
    with open(live / "logs" / "gcs_server.out", "w") as log:  # a live cluster's process keeps its logs open
        gcs = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               stdout=log)
    try:
        assert snapshot.new() == [ended, live]
        assert snapshot.remove_ended() == [live]
    finally:
        gcs.stdin.close()
        gcs.wait(30)
    assert not ended.exists() and live.exists() and old.exists()
    assert (elsewhere / "keep.txt").read_text() == "someone's"
    assert not os.path.lexists(root / "session_latest")  # it named a removed folder
    assert snapshot.remove_ended() == [] and not live.exists()  # its process ended: it goes too


def test_what_this_process_has_open_does_not_keep_a_folder(tmp_path):
    """A driver keeps its core worker's logs open in its cluster's folder after ray.shutdown()."""
    (tmp_path / "ray").mkdir()
    snapshot = raysessions.Snapshot.now({"RAY_TMPDIR": str(tmp_path)})
    ended = tmp_path / "ray" / "session_2026-11-30_11-00-00_000002_22"
    (ended / "logs").mkdir(parents=True)
    with open(ended / "logs" / "python-core-driver.log", "w"):
        assert snapshot.remove_ended() == [] and not ended.exists()


def test_the_latest_link_stays_when_it_names_a_folder_that_stays(tmp_path):
    root = tmp_path / "ray"
    root.mkdir()
    snapshot = raysessions.Snapshot.now({"RAY_TMPDIR": str(tmp_path)})
    ended = root / "session_2026-11-30_11-00-00_000002_22"
    ended.mkdir()
    older = tmp_path / "elsewhere"
    (root / "session_latest").symlink_to(older)
    assert snapshot.remove_ended() == []
    assert not ended.exists() and os.readlink(root / "session_latest") == str(older)


def test_in_use_is_inside_the_folder_not_a_sibling_that_shares_its_prefix(tmp_path):
    folder = tmp_path / "session_1"
    assert raysessions.in_use(folder, {f"{folder}/logs/raylet.out"})
    assert not raysessions.in_use(folder, {f"{tmp_path}/session_10/logs/raylet.out", "/dev/null"})
