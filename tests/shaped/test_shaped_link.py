"""The simulated hosts' links can be shaped to a rate (tc tbf), so what a slow network costs
shows here as it would between real hosts; the shaping goes with the cluster on every path."""
from __future__ import annotations

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
def test_unshaping_gives_the_bridge_speed_back(network):
    host = network.workers[0]
    network.shape_link(host, rate_mbit=RATE_MBIT)
    network.unshape_link(host)
    qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", host.veth], capture_output=True, text=True).stdout
    assert "tbf" not in qdiscs
