"""Scratch directories: keyed by cluster, lease and attempt; the last rank out removes its
attempt's; a directory nobody holds any more (its holder killed) is stale and swept."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpusession.run.node import scratch
from gpusession.run.spec import RankSpec, lease_scratch_dir, scratch_dir


def spec(cluster: str, lease_id: int, attempt: int) -> RankSpec:
    return RankSpec(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, master_addr="",
                    master_port=0, backend="gloo", node_gpu_ids=(), gpu_ids=(), lease_id=lease_id,
                    logical_gpus=True, return_value=True, caller_host="", caller_cwd="", pg_timeout_s=1.0,
                    attempt=attempt, cluster=cluster)


def test_two_clusters_and_two_attempts_never_share_a_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    dirs = {scratch_dir(spec(c, 7, a)) for c in ("session_a", "session_b") for a in (0, 1)}
    assert len(dirs) == 4 and all(d.startswith(str(tmp_path)) for d in dirs)
    assert scratch_dir(spec("session_a", 7, 1)) == os.path.join(lease_scratch_dir("session_a", 7), "attempt-1")


def test_the_last_rank_of_an_attempt_on_a_node_removes_the_directory_and_its_lease_folder_once_empty(tmp_path):
    path = str(tmp_path / "c" / "lease-1" / "attempt-0")
    first, second = scratch.Claim(path), scratch.Claim(path)
    later = scratch.Claim(str(tmp_path / "c" / "lease-1" / "attempt-1"))  # the next attempt, already here
    Path(path, "data.bin").write_bytes(b"x")
    assert first.release() is False and os.path.isdir(path)  # the other rank still runs
    assert second.release() is True and not os.path.exists(path)
    assert os.listdir(tmp_path / "c" / "lease-1") == ["attempt-1"]  # the lease's folder stays for it
    assert later.release() is True and os.listdir(tmp_path / "c") == []


def test_a_directory_whose_holder_was_killed_is_stale_and_a_held_one_is_kept(tmp_path):
    held = str(tmp_path / "session_1" / "lease-1" / "attempt-0")
    orphan = str(tmp_path / "session_2" / "lease-9" / "attempt-3")
    claim = scratch.Claim(held)
    holder = subprocess.Popen(  # another cluster's rank on this filesystem, then its host dies
        [sys.executable, "-c", "import sys, time; from gpusession.run.node.scratch import Claim; "
         "Claim(sys.argv[1]); print('held', flush=True); time.sleep(600)", orphan],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert scratch.remove_stale(str(tmp_path)) == []  # both held: nothing goes
        holder.kill()
        holder.wait()
        old = time.time() - 2 * scratch.UNLOCKED_GRACE_S
        os.utime(os.path.dirname(orphan), (old, old))
        foreign = tmp_path / "lease-5" / "data" / "shard"  # not this layout (an older version's): left alone
        foreign.mkdir(parents=True)
        os.utime(foreign, (old, old))
        assert scratch.remove_stale(str(tmp_path)) == [orphan]
        assert foreign.is_dir()
        assert not os.path.exists(tmp_path / "session_2")  # its emptied lease and cluster directories too
        assert os.path.isdir(held)
    finally:
        holder.kill()
        claim.release()
