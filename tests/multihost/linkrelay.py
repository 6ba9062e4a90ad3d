"""A simulated host's link with a fixed delay and a random loss, where the kernel has no netem.

The host's veth is taken off the bridge and a TAP device put on the bridge in its place; this
relay, a process in the root namespace, carries every Ethernet frame between the two (ARP, Ray's
gRPC, gloo's ports, the heartbeat: whatever the host sends or receives, on any port), holding
each one `delay_ms` and dropping each with probability `loss`, per direction, from a seeded
random stream. Rate shaping (tc tbf on both ends of the veth) still applies: the relay writes
into the veth through its qdisc. Cutting the link (the veth down) still cuts it: the relay's
sends fail and it drops them.

    python linkrelay.py relay VETH TAP DELAY_MS LOSS SEED   # prints "ready", counts on SIGTERM
    python linkrelay.py offloads-off IFNAME                 # run inside the host's namespace

Only the standard library: it runs by path with any Python. `Schedule` is the pure decision
(unit-tested in tests/unit); `start`/`stop` are the caller's side (SimCluster.shape_link).
"""
from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

MAX_DELAY_MS = 10_000.0
FRAME_MAX = 65_536
READY_LINE = "ready"
READY_TIMEOUT_S = 15.0
IDLE_WAKE_S = 0.5  # how often an idle relay checks that its parent is alive
SOCKET_BUFFER = 4 << 20  # a burst at the bridge's speed waits here, not dropped by the kernel


@dataclass(frozen=True)
class Impairment:
    """What the relay does to each frame, in each direction: hold it `delay_ms`, drop it with
    probability `loss` (0 <= loss < 1), from random streams seeded by `seed`."""
    delay_ms: float = 0.0
    loss: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.delay_ms <= MAX_DELAY_MS:  # also false for nan
            raise ValueError(f"delay_ms must be from 0 to {MAX_DELAY_MS:g} (milliseconds each way); "
                             f"got {self.delay_ms!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be a fraction from 0 to below 1 (0.01 drops 1 % of frames each way); "
                             f"got {self.loss!r}")

    @property
    def needed(self) -> bool:
        return self.delay_ms > 0 or self.loss > 0


class Schedule:
    """One direction's decisions: when a frame that arrived at `arrived` leaves, or None if it is
    lost. A fixed delay keeps frames in order, as a longer cable would."""

    def __init__(self, impairment: Impairment, direction: int) -> None:
        self._delay_s = impairment.delay_ms / 1000.0
        self._loss = impairment.loss
        self._rng = random.Random(impairment.seed * 2 + direction)  # the two directions lose apart

    def due(self, arrived: float) -> float | None:
        if self._loss and self._rng.random() < self._loss:
            return None
        return arrived + self._delay_s


# ----- the relay process --------------------------------------------------------------------------
PACKET_OUTGOING = 4  # a frame this host's side sent itself (the relay's own writes): not to be relayed
ETH_P_ALL = 0x0003
TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def open_tap(name: str) -> int:
    """A TAP device that lives as long as this process (non-persistent): no leftover on any path."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI).ljust(40, b"\0"))
    return fd


def open_port(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


class Counts:
    """The relay's tally, told on one line when it stops ("forwarded N dropped M")."""

    def __init__(self) -> None:
        self.forwarded = 0
        self.dropped = 0

    def line(self) -> str:
        return f"forwarded {self.forwarded} dropped {self.dropped}"


@dataclass(frozen=True)
class RelayCounts:
    """What a relay did to a link's frames, both directions together."""
    forwarded: int
    dropped: int

    @classmethod
    def parse(cls, line: str) -> "RelayCounts | None":
        match = re.fullmatch(r"forwarded (\d+) dropped (\d+)", line.strip())
        return cls(int(match[1]), int(match[2])) if match else None

    @property
    def frames(self) -> int:
        return self.forwarded + self.dropped


def relay(veth: str, tap: str, impairment: Impairment) -> None:
    tap_fd = open_tap(tap)
    port = open_port(veth)
    counts = Counts()
    signal.signal(signal.SIGTERM, lambda *_: (print(counts.line(), flush=True), os._exit(0)))
    parent = os.getppid()
    to_bridge, to_host = collections.deque(), collections.deque()
    from_host, from_bridge = Schedule(impairment, 0), Schedule(impairment, 1)
    print(READY_LINE, flush=True)
    while os.getppid() == parent:  # the test's process died: this relay (and its TAP) go too
        waits = [q[0][0] for q in (to_bridge, to_host) if q]
        timeout = max(0.0, min(waits) - time.monotonic()) if waits else IDLE_WAKE_S
        readable, _, _ = select.select([port, tap_fd], [], [], min(timeout, IDLE_WAKE_S))
        now = time.monotonic()
        if port in readable:
            for frame in _drain_port(port):
                _enqueue(to_bridge, from_host.due(now), frame, counts)
        if tap_fd in readable:
            for frame in _drain_tap(tap_fd):
                _enqueue(to_host, from_bridge.due(now), frame, counts)
        _send_due(to_bridge, now, lambda frame: os.write(tap_fd, frame))
        _send_due(to_host, now, port.send)


def _enqueue(queue: collections.deque, due: float | None, frame: bytes, counts: Counts) -> None:
    if due is None:
        counts.dropped += 1
    else:
        counts.forwarded += 1
        queue.append((due, frame))


def _drain_port(port: socket.socket, most: int = 256) -> list[bytes]:
    frames = []
    for _ in range(most):
        try:
            frame, address = port.recvfrom(FRAME_MAX)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # ENETDOWN once when the link is cut: nothing to read
            break
        if address[2] != PACKET_OUTGOING:
            frames.append(frame)
    return frames


def _drain_tap(fd: int, most: int = 256) -> list[bytes]:
    frames = []
    for _ in range(most):
        try:
            frames.append(os.read(fd, FRAME_MAX))
        except (BlockingIOError, InterruptedError):
            break
    return frames


def _send_due(queue: collections.deque, now: float, send) -> None:
    while queue and queue[0][0] <= now:
        _, frame = queue.popleft()
        try:
            send(frame)
        except OSError:  # the link is cut (ENETDOWN) or its queue full (ENOBUFS): lost, as on a wire
            pass


# ----- offloads: frames must leave the host whole ---------------------------------------------------
SIOCETHTOOL = 0x8946
# legacy ethtool "set" commands: tx checksum, scatter-gather, TSO, GSO, GRO
OFFLOAD_COMMANDS = (0x17, 0x19, 0x1F, 0x24, 0x2C)


def offloads_off(ifname: str) -> None:
    """A veth hands its peer frames with checksums left to hardware and segments of 64 KB; taken
    through a packet socket and a TAP they would arrive corrupt or too large. Off, every frame
    leaves complete and MTU-sized (what `ethtool -K IF tx off sg off tso off gso off gro off` does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for command in OFFLOAD_COMMANDS:
            value = ctypes.create_string_buffer(struct.pack("II", command, 0))
            request = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            try:
                fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
            except OSError:  # a feature the device cannot change: it is not on either
                pass


# ----- the caller's side ---------------------------------------------------------------------------
def start(*, veth: str, tap: str, bridge: str, netns: str, inner_if: str,
          impairment: Impairment) -> subprocess.Popen:
    """The relay between the host's veth and a new TAP on the bridge; returns its process once
    frames go through it. On any failure the relay is stopped and the veth is back on the bridge."""
    _run(["ip", "netns", "exec", netns, sys.executable, __file__, "offloads-off", inner_if])
    offloads_off(veth)
    proc = subprocess.Popen([sys.executable, __file__, "relay", veth, tap, repr(impairment.delay_ms),
                             repr(impairment.loss), str(impairment.seed)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        line = proc.stdout.readline().strip() if ready else ""
        if line != READY_LINE:
            raise RuntimeError(f"the link relay for {veth} did not start within {READY_TIMEOUT_S:g} s: "
                               f"{line or 'no output'} {_rest(proc)}")
        _run(["ip", "link", "set", veth, "nomaster"])  # first off the bridge: no frame takes both ways
        _run(["ip", "link", "set", tap, "master", bridge, "up"])
    except BaseException:
        stop(proc, veth=veth, bridge=bridge)
        raise
    return proc


def stop(proc: subprocess.Popen, *, veth: str, bridge: str) -> RelayCounts | None:
    """The veth back on the bridge, then the relay ended (its TAP goes with it). Returns what the
    relay counted, or None if it had ended already."""
    subprocess.run(["ip", "link", "set", veth, "master", bridge], capture_output=True)  # up or down as it was
    counts = ""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            counts = proc.communicate(timeout=5)[0].strip()
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    elif proc.stdout is not None:
        proc.stdout.close()
    return RelayCounts.parse(counts.splitlines()[-1]) if counts else None


def _rest(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        return ""
    return f"(exit status {proc.returncode}): {proc.stdout.read().strip()[-2000:]}"


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["offloads-off"]:
        offloads_off(argv[1])
    elif argv[:1] == ["relay"]:
        veth, tap, delay_ms, loss, seed = argv[1:6]
        relay(veth, tap, Impairment(float(delay_ms), float(loss), int(seed)))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
