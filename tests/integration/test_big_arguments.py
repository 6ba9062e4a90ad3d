"""A 200 MB argument reaches both ranks of a call whole, the caller's own memory grows by far less
than the data while it travels, the receipt says what was shipped, and the node's copy (in the
account's own 0700 folder in /dev/shm) goes with the lease (issue 33)."""
from __future__ import annotations

import os
import threading

import numpy
import pytest

import gpusession as gs
from gpusession.run import bulk

MB = 1_000_000


def anonymous_bytes() -> int:
    """This process's private memory (RssAnon): what a copy of the data in the caller would add.
    The object store's pages are shared memory and do not count here."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


class PeakMemory:
    """The highest RssAnon seen, sampled every 5 ms while the block runs."""

    def __enter__(self):
        self.start = self.peak = anonymous_bytes()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.005):
            self.peak = max(self.peak, anonymous_bytes())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


@pytest.mark.skipif(bulk.NODE_ROOT is None, reason="no /dev/shm on this machine")
def test_a_200_mb_argument_reaches_two_ranks_whole_without_a_copy_in_the_caller(cluster, quiet):
    data = numpy.random.default_rng(0).random(200 * MB // 8)  # 200 MB of float64
    expected = float(data.sum())

    @gs.distributed(gpus=2, return_all=True)
    def checksum(array):
        import glob

        lease = gs.context().lease_id  # where the node's copy lies: a file the size of the data
        copies = [path for path in glob.glob(os.path.join(bulk.node_base(), "*", f"lease-{lease}", "*"))
                  if os.path.getsize(path) == array.nbytes]
        return gs.context().rank, array.nbytes, float(array.sum()), copies

    with PeakMemory() as memory:
        seen = checksum(data)
    assert [row[:3] for row in seen] == [(0, data.nbytes, expected), (1, data.nbytes, expected)]
    assert memory.growth < 0.5 * data.nbytes, (
        f"the caller's own memory grew by {memory.growth / MB:.0f} MB for a {data.nbytes / MB:.0f} MB argument "
        "(bound: half the data)")
    info = checksum.last_run
    assert info.shipped_bytes == data.nbytes and "shipped 200 MB" in info.receipt()
    leftover = bulk.node_directory(cluster_name(), info.lease_id)
    assert seen[0][3] == seen[1][3] and len(seen[0][3]) == 1, seen  # one copy for the node's ranks
    assert os.path.dirname(seen[0][3][0]) == leftover, "the node's copy was not in the lease's own folder"
    base = os.lstat(bulk.node_base())  # this account's, and nobody else's to enter
    assert base.st_uid == os.geteuid() and base.st_mode & 0o777 == 0o700
    assert not os.path.exists(leftover), f"the node's copy {leftover} outlived its lease"


def cluster_name() -> str:
    import ray

    return ray.get_runtime_context().get_session_name()


@pytest.mark.skipif(bulk.NODE_ROOT is None, reason="no /dev/shm on this machine")
def test_a_200_mb_result_arrives_whole_and_writable_with_one_copy_and_the_receipt_says_so(cluster, quiet):
    @gs.distributed(gpus=2)
    def make():
        import torch

        return {"array": numpy.full(150 * MB // 8, 2.0), "tensor": torch.ones(50 * MB // 4)}

    import torch  # noqa: F401  (unpickling the tensor imports torch: ~120 MB that are not the data)

    with PeakMemory() as memory:
        result = make()
    assert result["array"].nbytes == 150 * MB and float(result["array"].sum()) == 2.0 * (150 * MB // 8)
    assert float(result["tensor"].sum()) == 50 * MB // 4
    result["array"][0] = 5.0  # the caller's own copy: writable
    result["tensor"][0] = 5.0
    assert memory.growth < 1.5 * 200 * MB, (
        f"the caller's own memory grew by {memory.growth / MB:.0f} MB for a 200 MB result (bound: 1.5 copies)")
    info = make.last_run
    assert 200 * MB <= info.returned_bytes < 200 * MB + MB and info.returned_s > 0, info
    assert f"returned {info.returned_bytes / 1e6:,.0f} MB in {info.returned_s:.2f} s" in info.receipt()
    leftover = bulk.node_directory(cluster_name(), info.lease_id)
    assert not os.path.exists(leftover), f"the rank's result file {leftover} outlived its lease"


def test_a_call_that_cannot_be_shipped_fails_before_any_gpu_is_asked_for(cluster, quiet):
    import threading

    @gs.distributed(gpus=2)
    def holds(lock):
        return lock is not None

    with pytest.raises(TypeError, match="pickle"):
        holds(threading.Lock())
    assert holds.last_run.lease_id is None, "a lease was asked for a call that could not be shipped"


@pytest.mark.skipif(bulk.NODE_ROOT is None, reason="no /dev/shm on this machine")
def test_a_call_whose_node_folder_others_may_enter_fails_at_once_naming_it_and_what_to_do(cluster, quiet):
    """The workers keep node files only in a folder no other account may enter (run/privatedir.py):
    one they find open to others (here: their own, made 0755) fails the call with the rank's error
    naming the folder, its mode and what to do; nothing is written there, and the folder is left
    as it was found."""
    @gs.distributed(gpus=1)
    def big():
        return numpy.ones(2 * MB // 8)

    base = bulk.node_base()
    os.chmod(base, 0o755)
    try:
        with pytest.raises(gs.WorkerFailed) as failed:
            big()
        assert os.stat(base).st_mode & 0o777 == 0o755, "the workers changed the folder they refused"
    finally:
        os.chmod(base, 0o700)
    message = str(failed.value)
    assert f"raised NotPrivate: {base} is this account's" in message and "mode 0755" in message, message
    assert f"chmod 700 {base}" in message, message
    assert big.last_run.lease_id is not None and float(big().sum()) == 2 * MB // 8  # private again: it works
