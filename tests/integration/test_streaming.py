"""Output and metrics reach the caller while the function runs, captured at the fd level."""
from __future__ import annotations

import glob
import io
import os
import uuid

import gpusession as gs
from gpusession.observe import events
from gpusession.observe.console import ConsoleObserver

from ..machine import gpus_text


class _Recorder(events.Observer):
    def __init__(self, release_file: str | None = None) -> None:
        self.chunks: list[tuple[int, str, str]] = []
        self.reports: list[dict] = []
        self.release_file = release_file

    def output(self, rank, stream, text):
        self.chunks.append((rank, stream, text))
        if self.release_file and "waiting for the caller" in text:
            open(self.release_file, "w").close()  # only now may the function finish

    def report(self, metrics, info):
        self.reports.append(metrics)

    def text(self, rank: int | None = None, stream: str | None = None) -> str:
        return "".join(t for r, s, t in self.chunks if (rank is None or r == rank) and (stream is None or s == stream))


def _recording(recorder: _Recorder):
    events.set_observer_factory(lambda world_size: recorder)


def test_output_reaches_the_caller_before_the_function_finishes(cluster, tmp_path):
    release = str(tmp_path / "release")
    recorder = _Recorder(release_file=release)
    _recording(recorder)

    @gs.distributed(gpus=1, timeout="60s")
    def waits_for_its_own_output_to_arrive(path):
        import time

        print("waiting for the caller", flush=True)
        while not os.path.exists(path):  # created by the caller on receipt of the line above
            time.sleep(0.01)
        return "released by the caller"

    try:
        assert waits_for_its_own_output_to_arrive(release) == "released by the caller"
    finally:
        events.set_observer_factory(None)


def test_c_level_and_python_output_are_captured_per_stream_and_rank(cluster):
    recorder = _Recorder()
    _recording(recorder)

    @gs.distributed(gpus=2)
    def noisy():
        import ctypes
        import sys

        rank = gs.context().rank
        print(f"python stdout {rank}")
        print(f"python stderr {rank}", file=sys.stderr)
        os.write(1, f"fd1 write {rank}\n".encode())
        ctypes.CDLL(None).printf(f"libc printf {rank}\n".encode())  # C stdio, buffered in C

    try:
        noisy()
    finally:
        events.set_observer_factory(None)
    for rank in (0, 1):
        out, err = recorder.text(rank, "stdout"), recorder.text(rank, "stderr")
        assert f"python stdout {rank}" in out and f"fd1 write {rank}" in out and f"libc printf {rank}" in out
        assert f"python stderr {rank}" in err and "python stdout" not in err


def test_captured_output_is_not_also_written_to_rays_worker_logs(cluster, quiet):
    """Ray forwards what is in its per-worker log files; captured output never lands there."""
    import ray

    marker = f"only-once-{uuid.uuid4().hex}"

    @gs.distributed(gpus=2)
    def prints_marker(text):
        import ctypes

        print(text)
        ctypes.CDLL(None).printf((text + "\n").encode())

    prints_marker(marker)
    session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
    log_files = glob.glob(os.path.join(session_dir, "logs", "worker-*"))
    assert log_files  # the workers' own logs exist; the marker is in none of them
    assert not [f for f in log_files if marker in open(f, errors="replace").read()]


def test_rank_0_reports_form_the_history_in_order_and_other_ranks_reports_are_dropped(cluster):
    recorder = _Recorder()
    _recording(recorder)

    @gs.distributed(gpus=2)
    def reports():
        import torch

        rank = gs.context().rank
        for step in range(5):
            gs.report(step=step, loss=torch.tensor(1.0 / (step + 1)), rank=rank)

    try:
        reports()
    finally:
        events.set_observer_factory(None)
    import torch

    expected = [{"step": s, "loss": torch.tensor(1.0 / (s + 1)).item(), "rank": 0} for s in range(5)]
    assert reports.last_run.history == expected
    assert recorder.reports == expected  # streamed as they happened, tensors as plain numbers
    assert all(type(h["loss"]) is float for h in reports.last_run.history)


def test_console_renderer_prefixes_whole_lines_with_the_rank_and_ends_with_a_receipt(cluster):
    out, err = io.StringIO(), io.StringIO()
    events.set_observer_factory(lambda world_size: ConsoleObserver(world_size, stdout=out, stderr=err))

    @gs.distributed(gpus=2)
    def chatty():
        import sys

        rank = gs.context().rank
        for i in range(3):
            sys.stdout.write(f"line {i} ")
            sys.stdout.write(f"of rank {rank}\n")
        gs.report(loss=0.25)

    try:
        chatty()
    finally:
        events.set_observer_factory(None)
    lines = out.getvalue().splitlines()
    for rank in (0, 1):
        mine = [l for l in lines if l.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] line {i} of rank {rank}" for i in range(3)]
    assert "[metrics] loss=0.25" in lines
    assert gpus_text(2, logical=cluster.logical) in err.getvalue() and "released" in err.getvalue()
