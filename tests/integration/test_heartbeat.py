"""The heartbeat between worker actors and the run controller, over real local sockets: a
closed connection is a loss at once, a silent one after `silence_s`, a live one never; only the
holder of the actor's token gets beats, and a flood of other connections does not stop them."""
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
          "s = BeatServer('127.0.0.1'); print(s.port, s.token, flush=True); time.sleep(600)")


def _servers(count: int) -> tuple[list[subprocess.Popen], list[tuple[str, int, str]]]:
    """Beat servers in processes of their own, as worker actors; each one's (address, port, token)."""
    root = str(Path(__file__).resolve().parents[2])
    procs = [subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root}) for _ in range(count)]
    targets = []
    for proc in procs:
        port, token = proc.stdout.readline().split()
        targets.append(("127.0.0.1", int(port), token))
    return procs, targets


def test_a_live_worker_keeps_beating_and_one_whose_process_is_killed_is_lost_at_once():
    procs, targets = _servers(2)
    try:
        monitor = BeatMonitor({0: targets[0], 1: targets[1]}, silence_s=1.0)
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
    monitor = BeatMonitor({"r": ("127.0.0.1", listener.getsockname()[1], "token")}, silence_s=1.0)
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
    monitor = BeatMonitor({7: ("127.0.0.1", port, "token")}, silence_s=1.0)
    try:
        assert list(monitor.unwatched) == [7]
        time.sleep(1.5)
        assert monitor.take_losses() == []  # a run Ray can run is not failed by the heartbeat
    finally:
        monitor.close()


def _first_bytes(conn: socket.socket, within_s: float) -> tuple[bytes, float]:
    """What arrives on conn before it closes or within_s passes, and when it closed (inf: open)."""
    conn.settimeout(0.1)
    got, end = b"", time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            data = conn.recv(64)
        except socket.timeout:
            continue
        if not data:
            return got, time.monotonic()
        got += data
    return got, float("inf")


def test_a_connection_without_the_token_or_with_a_wrong_one_gets_no_beat_and_is_closed():
    server = heartbeat.BeatServer("127.0.0.1")
    try:
        silent = socket.create_connection(("127.0.0.1", server.port))
        wrong = socket.create_connection(("127.0.0.1", server.port))
        opened = time.monotonic()
        wrong.sendall(b"0" * len(server.token))
        got, closed = _first_bytes(wrong, 2.0)
        assert got == b"" and closed - opened < 1.0  # a wrong token: closed at once
        got, closed = _first_bytes(silent, heartbeat.AUTH_TIMEOUT_S + SLACK_S + 1.0)
        assert got == b"" and closed - opened < heartbeat.AUTH_TIMEOUT_S + SLACK_S  # no token in time: closed
        holder = socket.create_connection(("127.0.0.1", server.port))
        holder.sendall(server.token.encode())
        got, closed = _first_bytes(holder, 1.0)
        assert got.startswith(heartbeat.BEAT * 2) and closed == float("inf")  # the token holder's beats
        for conn in (silent, wrong, holder):
            conn.close()
    finally:
        server.close()


def _count(pid: int, what: str) -> int:
    if what == "fd":
        return len(os.listdir(f"/proc/{pid}/fd"))
    return int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("Threads:")))


def test_a_flood_of_other_connections_neither_stops_the_beats_nor_costs_the_worker_threads():
    """Another local account may connect to the port (it listens on the node's address); what it
    opens costs the actor no thread and at most MAX_PENDING descriptors."""
    procs, targets = _servers(1)
    pid = procs[0].pid
    flood: list[socket.socket] = []
    try:
        time.sleep(0.3)
        threads = _count(pid, "threads")
        for _ in range(3 * heartbeat.MAX_PENDING):
            flood.append(socket.create_connection(targets[0][:2]))
        monitor = BeatMonitor({0: targets[0]}, silence_s=1.0)
        try:
            time.sleep(1.5)  # longer than silence_s
            assert monitor.take_losses() == [] and monitor.unwatched == {}
            assert _count(pid, "threads") == threads
            assert _count(pid, "fd") <= heartbeat.MAX_PENDING + 16  # the oldest waiting ones were closed
        finally:
            monitor.close()
    finally:
        for conn in flood:
            conn.close()
        procs[0].kill()
        procs[0].wait()


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
