"""The simulated hosts' links can be shaped to a rate (tc tbf), a delay and a loss (a relay,
tests/multihost/linkrelay.py), so what a slow or bad network costs shows here as it would
between real hosts; the shaping goes with the cluster on every path."""
from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from ..multihost.simcluster import SimCluster, can_run

RATE_MBIT = 40
PAYLOAD_BYTES = 10_000_000  # 2 s at 40 Mbit/s
# A shaper can only slow a transfer: it must take at least 90 % of payload / rate (a burst of
# the bucket's size may pass at once); nothing bounds it from above on a loaded machine.
AT_LEAST = 0.9
RECEIVER = ("import socket, sys\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('0.0.0.0', 5701)); s.listen(1); print('ready', flush=True)\n"
            "c, _ = s.accept(); n = 0\n"
            "while (b := c.recv(1 << 16)): n += len(b)\n"
            "print(n, flush=True)")
ECHO = ("import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 5702)); s.listen(1); print('ready', flush=True)\n"
        "c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        "while (b := c.recv(1)): c.sendall(b)")
PINGS = 20
PING = ("import socket, sys, time\n"
        "c = socket.create_connection((sys.argv[1], 5702)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        f"for _ in range({PINGS}):\n"
        "    t = time.monotonic(); c.sendall(b'x'); c.recv(1); print(time.monotonic() - t, flush=True)")
DELAY_MS = 20
LOSS = 0.01
SENDER = ("import socket, sys, time\n"
          "c = socket.create_connection((sys.argv[1], 5701)); t = time.monotonic()\n"
          "c.sendall(b'x' * int(sys.argv[2])); c.shutdown(socket.SHUT_WR); c.recv(1)\n"
          "print(time.monotonic() - t, flush=True)")


@pytest.fixture
def network():
    reason = can_run()
    if reason:
        pytest.skip(reason)
    cluster = SimCluster(hosts=2, gpus_per_host=0)
    cluster.start(nodes=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def _transfer_seconds(cluster: SimCluster) -> float:
    one, two = cluster.workers
    receiver = cluster.popen(two, ["python3", "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sender = cluster.popen(one, ["python3", "-c", SENDER, two.ip, str(PAYLOAD_BYTES)],
                               stdout=subprocess.PIPE, text=True)
        out, _ = sender.communicate(timeout=120)
        assert receiver.stdout.readline().strip() == str(PAYLOAD_BYTES)
        return float(out.strip())
    finally:
        receiver.kill()
        receiver.wait()


@pytest.mark.slow
def test_a_shaped_link_carries_no_more_than_its_rate(network):
    network.shape_link(network.workers[0], rate_mbit=RATE_MBIT)
    took = _transfer_seconds(network)
    floor = PAYLOAD_BYTES * 8 / (RATE_MBIT * 1e6)
    assert took >= AT_LEAST * floor, (
        f"{PAYLOAD_BYTES / 1e6:g} MB took {took:.2f} s over a {RATE_MBIT} Mbit/s link; at least "
        f"{AT_LEAST * floor:.2f} s ({AT_LEAST:.0%} of {floor:.2f} s) if the shaper works")


@pytest.mark.slow
def test_unshaping_removes_the_rate_limit_from_the_hosts_link(network):
    host = network.workers[0]
    network.shape_link(host, rate_mbit=RATE_MBIT)
    network.unshape_link(host)
    qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", host.veth], capture_output=True, text=True).stdout
    assert "tbf" not in qdiscs


def _round_trips(cluster: SimCluster) -> list[float]:
    one, two = cluster.workers
    echo = cluster.popen(two, ["python3", "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout.readline().strip() == "ready"
        ping = cluster.popen(one, ["python3", "-c", PING, two.ip], stdout=subprocess.PIPE, text=True)
        out, _ = ping.communicate(timeout=120)
        return [float(line) for line in out.split()]
    finally:
        echo.kill()
        echo.wait()


@pytest.mark.slow
def test_a_delayed_lossy_link_holds_every_frame_and_loses_about_its_share(network):
    network.shape_link(network.workers[0], delay_ms=DELAY_MS, loss=LOSS, seed=1)
    round_trips = _round_trips(network)
    took = _transfer_seconds(network)  # arrives whole: TCP sends again what the link lost
    counts = network.unshape_link(network.workers[0])
    assert len(round_trips) == PINGS and min(round_trips) >= 2 * DELAY_MS / 1000, (
        f"round trips {min(round_trips) * 1000:.1f}-{max(round_trips) * 1000:.1f} ms over a link that holds "
        f"each frame {DELAY_MS} ms each way: none may be under {2 * DELAY_MS} ms")
    spread = 5 * math.sqrt(counts.frames * LOSS * (1 - LOSS))  # five binomial standard deviations
    assert abs(counts.dropped - counts.frames * LOSS) < spread, (
        f"the relay dropped {counts.dropped} of {counts.frames} frames; {counts.frames * LOSS:.0f} +- {spread:.0f} "
        f"at {LOSS:.0%}")
    assert took > 0


@pytest.mark.slow
def test_unshaping_a_delayed_link_puts_the_host_back_on_the_bridge_with_no_relay_left(network):
    host = network.workers[0]
    network.shape_link(host, rate_mbit=RATE_MBIT, delay_ms=DELAY_MS, loss=LOSS)
    relay = network.relays[host.name]
    on_bridge = subprocess.run(["ip", "-o", "link", "show", "master", network.bridge], capture_output=True,
                               text=True).stdout
    assert f"{network.tag}t1" in on_bridge and f" {host.veth}@" not in on_bridge  # the relay in its place
    network.unshape_link(host)
    on_bridge = subprocess.run(["ip", "-o", "link", "show", "master", network.bridge], capture_output=True,
                               text=True).stdout
    assert f" {host.veth}@" in on_bridge and f"{network.tag}t" not in on_bridge
    assert relay.poll() is not None
    round_trips = sorted(_round_trips(network))
    assert round_trips[len(round_trips) // 2] < DELAY_MS / 1000  # no frame held any more (the median)


def test_bad_link_settings_are_refused_before_anything_changes():
    cluster = SimCluster(hosts=1, gpus_per_host=0)  # not started: nothing may be touched
    try:
        with pytest.raises(ValueError, match="^loss must be"):
            cluster.shape_link(cluster.workers[0], loss=1.5)
        with pytest.raises(ValueError, match="^rate_mbit must be"):
            cluster.shape_link(cluster.workers[0], rate_mbit=0)
    finally:
        shutil.rmtree(cluster.base, ignore_errors=True)
