"""The suite's own clean-up of the temporary folder (gpusession/run/node/leftovers.py, run by conftest's
`no_folders_left_in_tmp` at the session's end): what the session's clusters left goes, what was
there before and what a live process holds stay. Real folders, real locks."""
from __future__ import annotations

import os

from gpusession.run.node import scratch, warmdir

from gpusession.run.node.leftovers import Snapshot


def test_a_warm_folder_made_during_the_session_goes_once_its_host_is_gone_and_one_from_before_stays(tmp_path):
    older = warmdir.make(str(tmp_path))
    os.close(older.lock_fd)  # its host ended before the session: not the session's to remove
    snapshot = Snapshot.now(str(tmp_path))
    made = warmdir.make(str(tmp_path))
    os.close(made.lock_fd)  # Ray ended its host
    assert snapshot.remove_new(timeout_s=0) == []
    assert not os.path.exists(made.path)
    assert os.path.isdir(older.path)


def test_a_folder_a_live_process_holds_is_left_and_named(tmp_path):
    snapshot = Snapshot.now(str(tmp_path))
    live = warmdir.make(str(tmp_path))
    try:
        assert [str(path) for path in snapshot.remove_new(timeout_s=0.3)] == [live.path]
        assert os.path.isdir(live.path)
    finally:
        os.close(live.lock_fd)
    assert snapshot.remove_new(timeout_s=0) == []
    assert not os.path.exists(live.path)


def test_a_new_clusters_scratch_folder_goes_once_no_rank_holds_it_and_with_it_a_scratch_root_the_session_made(
        tmp_path):
    snapshot = Snapshot.now(str(tmp_path))
    root = tmp_path / f"gpusession-scratch-{os.geteuid()}"
    claim = scratch.Claim(str(root / "session_2026_x" / "lease-7" / "attempt-0"))
    left = snapshot.remove_new(timeout_s=0.3)
    assert sorted(left) == [root, root / "session_2026_x"]  # a rank still runs
    assert claim.release()  # the rank ends: its attempt folder goes, its empty lease folder stays
    assert snapshot.remove_new(timeout_s=0) == []
    assert os.listdir(tmp_path) == []


def test_a_scratch_root_from_before_stays_and_a_link_is_not_followed(tmp_path):
    root = tmp_path / f"gpusession-scratch-{os.geteuid()}"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "gpusession-warm-inside").mkdir(parents=True)
    snapshot = Snapshot.now(str(tmp_path))
    (root / "session_2026_y").mkdir()
    (tmp_path / "gpusession-warm-link").symlink_to(elsewhere)
    assert snapshot.remove_new(timeout_s=0) == []
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", f"gpusession-scratch-{os.geteuid()}", "gpusession-warm-link"]
    assert os.listdir(root) == []
    assert os.listdir(elsewhere) == ["gpusession-warm-inside"]
