"""The heartbeat between worker actors and the run controller, over real local sockets: a
closed connection is a loss at once, a silent one after `silence_s`, a live one never."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusession.run import heartbeat
from gpusession.run.heartbeat import BeatMonitor, silence_timeout

SLACK_S = 1.5  # a loaded 2-core machine may run the monitor's thread late


def wait_losses(monitor: BeatMonitor, deadline_s: float) -> tuple[list, float]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        losses = monitor.take_losses()
        if losses:
            return losses, time.monotonic()
        time.sleep(0.02)
    return [], time.monotonic()


SERVER = ("import sys, time; from gpusession.run.heartbeat import BeatServer; "
          "s = BeatServer('127.0.0.1'); print(s.port, flush=True); time.sleep(600)")


def test_a_live_worker_keeps_beating_and_one_whose_process_is_killed_is_lost_at_once():
    root = str(Path(__file__).resolve().parents[2])
    procs = [subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root}) for _ in range(2)]
    try:
        ports = [int(p.stdout.readline()) for p in procs]
        monitor = BeatMonitor({0: ("127.0.0.1", ports[0]), 1: ("127.0.0.1", ports[1])}, silence_s=1.0)
        try:
            time.sleep(1.5)  # longer than silence_s: the beats kept both alive
            assert monitor.take_losses() == []
            procs[1].send_signal(signal.SIGKILL)  # the kernel closes its sockets: no beat, an end
            killed = time.monotonic()
            losses, seen = wait_losses(monitor, 3.0)
            assert [loss.key for loss in losses] == [1] and "stopped" in losses[0].how
            assert seen - killed < 0.3 + SLACK_S  # at once, not after silence_s
            time.sleep(1.2)
            assert monitor.take_losses() == []  # the live one still beats
        finally:
            monitor.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_silent_worker_is_lost_after_silence_s_and_not_before():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never beats: a host gone silent
    monitor = BeatMonitor({"r": ("127.0.0.1", listener.getsockname()[1])}, silence_s=1.0)
    connected = time.monotonic()
    try:
        accepted, _ = listener.accept()
        losses, seen = wait_losses(monitor, 1.0 + SLACK_S + 1.0)
        assert [loss.key for loss in losses] == ["r"] and losses[0].how.startswith("silent for ")
        assert 1.0 <= seen - connected < 1.0 + SLACK_S
        accepted.close()
    finally:
        monitor.close()
        listener.close()


def test_a_worker_that_cannot_be_reached_is_left_to_ray_not_declared_lost():
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens there now: what a firewall that rejects looks like
    monitor = BeatMonitor({7: ("127.0.0.1", port)}, silence_s=1.0)
    try:
        assert list(monitor.unwatched) == [7]
        time.sleep(1.5)
        assert monitor.take_losses() == []  # a run Ray can run is not failed by the heartbeat
    finally:
        monitor.close()


@pytest.mark.parametrize("value", ["abc", "0", "0.5", "601", "nan", "-3"])
def test_a_bad_silence_setting_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(heartbeat.SILENCE_ENV, value)
    with pytest.raises(ValueError, match=f"GPUSESSION_HOST_SILENCE_S must be a number of seconds from 1 to 600.*{value!r}"):
        silence_timeout()


def test_the_silence_setting_defaults_to_5_s_and_takes_a_number(monkeypatch):
    monkeypatch.delenv(heartbeat.SILENCE_ENV, raising=False)
    assert silence_timeout() == 5.0
    monkeypatch.setenv(heartbeat.SILENCE_ENV, "2.5")
    assert silence_timeout() == 2.5
