"""A Ray cluster of several simulated hosts on one Linux machine (see README.md here).

Each host is a network namespace on a private bridge, with its own address, UTS hostname,
/etc/hosts (ip netns exec bind-mounts /etc/netns/NS/hosts), HOME, TMPDIR and Ray node. The
head is a host like the others, in its own namespace: nothing of the simulated cluster is on
the root namespace's network, so it can never reach, or be reached by, the other Ray clusters
that run on the same machine, and its ports never collide with theirs. Drivers (a notebook's
kernel, a benchmark) run on a host with `popen`.

Everything is named after this process's pid (gsmh<pid>...), and torn down by `stop()` on every
path; `start()` also removes what an earlier run left when its process was killed before it
could clean up.
"""
from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import linkrelay
from .linkrelay import Impairment, RelayCounts

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "gsmh"
_INSTANCES = itertools.count()
RAY_PORT = 6379
READY_LINE = "Ray runtime started"
STARTUP_NICE = -10
INNER_IF = "simnet0"  # the host's interface on the bridge, as seen inside its namespace
NODE_PORTS = {"dashboard-agent-grpc-port": 52366, "dashboard-agent-listen-port": 52365, "metrics-export-port": 52367,
              "runtime-env-agent-port": 52368, "node-manager-port": 52369, "object-manager-port": 52370}
RESOLVE_MODES = ("own", "loopback")  # a host's own name -> its address, or -> 127.0.1.1 (Debian)


class SimClusterError(RuntimeError):
    """The simulated cluster could not be set up; the message names what did not come up."""


@dataclass
class SimHost:
    name: str  # its hostname
    netns: str
    ip: str
    veth: str  # its end on the bridge, in the root namespace: down = the host's link is cut
    base: Path  # HOME and TMPDIR live under it
    gpus: int
    cpus: int
    proc: subprocess.Popen | None = None  # `ray start --block`, leader of its own session
    log_path: Path | None = None
    own_head: bool = False  # heads a Ray cluster of its own (a host added with add_host(head=True))
    ports_offset: int = 0  # added to its node's fixed ports (each restart_host adds 10)

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"


@dataclass
class SimCluster:
    """hosts=2 GPU hosts beside the head (which has no GPUs, as in cluster/README.md)."""
    hosts: int = 2
    gpus_per_host: int = 2
    cpus_per_host: int = 1
    object_store_bytes: int = 100_000_000  # each node's; small, as the tests' calls move little data
    resolve: str = "own"
    ready_timeout_s: float = 120.0
    extra_env: dict = field(default_factory=dict)  # for every Ray node (and drivers)

    def __post_init__(self) -> None:
        if self.resolve not in RESOLVE_MODES:
            raise ValueError(f"resolve must be one of {RESOLVE_MODES}, not {self.resolve!r}")
        # one process may hold several clusters at once (the multihost session's and a shaped-link
        # test's): a letter per instance keeps their bridges, namespaces and subnets apart
        instance = next(_INSTANCES)
        self.tag = f"{PREFIX}{os.getpid()}{chr(ord('a') + instance % 26)}"
        self.subnet = f"10.213.{(os.getpid() + 37 * instance) % 250}"  # private: this bridge is on no other network
        self.bridge = f"{self.tag}br"
        self.base = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/tmp"))  # short: Ray's socket paths
        self.token = secrets.token_hex(16)
        names = ["head"] + [f"host{i}" for i in range(1, self.hosts + 1)]
        self.all_hosts = [
            SimHost(name=name, netns=f"{self.tag}-{name}", ip=f"{self.subnet}.{10 + i}", veth=f"{self.tag}v{i}",
                    base=self.base / name, gpus=0 if i == 0 else self.gpus_per_host, cpus=self.cpus_per_host)
            for i, name in enumerate(names)
        ]
        self.added: list[SimHost] = []  # hosts of add_host(): on the bridge, in no one's `workers`
        self.started: list[subprocess.Popen] = []
        self.relays: dict[str, subprocess.Popen] = {}  # host name -> its link's relay (shape_link)

    # ---- the cluster's shape -------------------------------------------------------------
    @property
    def head(self) -> SimHost:
        return self.all_hosts[0]

    @property
    def workers(self) -> list[SimHost]:
        return self.all_hosts[1:]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def host(self, name: str) -> SimHost:
        return next(h for h in self._every_host() if h.name == name)

    def _every_host(self) -> list[SimHost]:
        return self.all_hosts + self.added

    # ---- start and stop ------------------------------------------------------------------
    def start(self, *, nodes: bool = True) -> "SimCluster":
        """The network and hosts; with nodes=False no Ray node is started (to try the network)."""
        remove_leftovers()
        try:
            self._network()
            self.set_resolution(self.resolve)
            for host in self.all_hosts if nodes else ():  # one at a time: starting nodes at once slows them all
                self.start_node(host)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Every process of every host, the links' relays, the namespaces, the bridge and the
        files; never raises."""
        for name, proc in list(self.relays.items()):
            linkrelay.stop(proc, veth=self.host(name).veth, bridge=self.bridge)
        self.relays.clear()
        for host in self._every_host():
            kill_namespace(host.netns)
        for proc in self.started:
            _reap(proc)
        for host in self._every_host():
            _run(["ip", "netns", "del", host.netns], check=False)
            shutil.rmtree(f"/etc/netns/{host.netns}", ignore_errors=True)
        _run(["ip", "link", "del", self.bridge], check=False)
        shutil.rmtree(self.base, ignore_errors=True)
        self.added.clear()

    def __enter__(self) -> "SimCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _network(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for host in self.all_hosts:
            self._plug(host)

    def _plug(self, host: SimHost) -> None:
        """The host's namespace, directories and interface on the bridge."""
        for path in (host.home, host.tmp):
            path.mkdir(parents=True, exist_ok=True)
        os.makedirs(f"/etc/netns/{host.netns}", exist_ok=True)
        _run(["ip", "netns", "add", host.netns])
        peer = f"{host.veth}p"
        _run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", host.netns])
        _run(["ip", "-n", host.netns, "link", "set", peer, "name", INNER_IF])
        _run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", INNER_IF])
        _run(["ip", "-n", host.netns, "link", "set", INNER_IF, "up"])
        _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        _run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])

    def add_host(self, name: str, *, head: bool = False, home_of: SimHost | None = None) -> SimHost:
        """Another host on the bridge, with no GPUs, started with a Ray node: the head of a cluster
        of its own (head=True) or a node of this one. home_of: its HOME is that host's (a home
        directory shared over NFS). Taken down by remove_host() or stop()."""
        index = len(self.all_hosts) + len(self.added)
        host = SimHost(name=name, netns=f"{self.tag}-{name}", ip=f"{self.subnet}.{10 + index}",
                       veth=f"{self.tag}v{index}", base=self.base / name, gpus=0, cpus=self.cpus_per_host,
                       own_head=head)
        self.added.append(host)
        if home_of is not None:
            host.base.mkdir(parents=True, exist_ok=True)
            host.home.symlink_to(home_of.home, target_is_directory=True)
        self._plug(host)
        self.set_resolution(self.resolve)  # every host knows its name
        self.start_node(host)
        return host

    def remove_host(self, host: SimHost) -> None:
        """Every process of an added host, its namespace (and with it its link) and its files."""
        self.unshape_link(host)
        kill_namespace(host.netns)
        _run(["ip", "netns", "del", host.netns], check=False)
        shutil.rmtree(f"/etc/netns/{host.netns}", ignore_errors=True)
        shutil.rmtree(host.base, ignore_errors=True)
        self.added.remove(host)
        self.set_resolution(self.resolve)

    def set_resolution(self, mode: str) -> None:
        """How each host resolves its own name: "own" (its bridge address) or "loopback"
        (127.0.1.1, the Debian/Ubuntu default). Other hosts' names always resolve to their
        addresses. The file is rewritten in place, so running hosts see the change at once."""
        if mode not in RESOLVE_MODES:
            raise ValueError(f"mode must be one of {RESOLVE_MODES}, not {mode!r}")
        self.resolve = mode
        for host in self._every_host():
            lines = ["127.0.0.1 localhost"]
            for other in self._every_host():
                own = other is host
                lines.append(f"{'127.0.1.1' if own and mode == 'loopback' else other.ip} {other.name}")
            with open(f"/etc/netns/{host.netns}/hosts", "w") as f:  # same inode: the bind mount follows
                f.write("\n".join(lines) + "\n")

    # ---- processes on a host -------------------------------------------------------------
    def env(self, host: SimHost, **extra: str) -> dict:
        """The environment of a process on `host`: its HOME and TMPDIR, this repository on
        PYTHONPATH, Ray's token; nothing of the caller's Ray or collective settings."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "GPUSESSION_", "GLOO_", "NCCL_"))}
        env.update({"HOME": str(host.home), "TMPDIR": str(host.tmp), "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    "RAY_agent_register_timeout_ms": "120000"})  # a loaded machine starts agents slowly
        env.update(self.extra_env)
        env.update(extra)
        return env

    def popen(self, host: SimHost, argv: list[str], *, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start argv on `host` (its namespace, hostname and /etc/hosts), leader of a new session."""
        wrapped = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--",
                   "sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv]
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(wrapped, env=env or self.env(host), cwd=str(host.home),
                                start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def python(self, host: SimHost, code_or_path: str, *args: str, **env: str) -> subprocess.Popen:
        """A Python driver on `host` connected to this cluster by RAY_ADDRESS; stdout and stderr
        merged into one text pipe."""
        argv = [sys.executable, code_or_path, *args] if code_or_path.endswith(".py") else \
            [sys.executable, "-c", code_or_path, *args]
        return self.popen(host, argv, env=self.env(host, **{"RAY_ADDRESS": self.address, **env}),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_python(self, host: SimHost, path: str, *args: str, timeout: float, **env: str) -> tuple[int | None, str]:
        """Run a Python script on `host` to its end: (exit status, or None if it ran past
        `timeout` and was killed; its output)."""
        proc = self.python(host, path, *args, **env)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            kill_session(proc)
            return None, proc.communicate()[0]

    def start_node(self, host: SimHost, *, attempts: int = 3) -> None:
        """Start the host's Ray node and wait until it is up. On a loaded machine a raylet can
        give up on its own agents (it waits ~15 s for them, not configurable): then the host's
        processes are killed and the node is started again, up to `attempts` times."""
        first_failure = ""
        for attempt in range(1, attempts + 1):
            self._launch_node(host)
            try:
                self._wait_ready([host])
                _set_group_nice(host.proc.pid, 0)  # back to normal once the node is up
                return
            except SimClusterError as exc:
                kill_namespace(host.netns)
                first_failure = first_failure or str(exc)
                joins_this_head = host is not self.head and not host.own_head
                if attempt == attempts or (joins_this_head and not self.gcs_running()):  # nothing to join
                    if attempt > 1:
                        raise SimClusterError(f"{exc}\n(attempt {attempt} of {attempts}; the first attempt "
                                              f"failed with:)\n{first_failure}") from exc
                    raise

    def gcs_running(self) -> bool:
        return bool(self._gcs_pids())

    def _gcs_pids(self) -> list[int]:
        return [pid for pid in namespace_pids(self.head.netns) if _comm(pid) == "gcs_server"]

    def _launch_node(self, host: SimHost) -> None:
        ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
               f"--node-ip-address={host.ip}", f"--num-cpus={host.cpus}", f"--num-gpus={host.gpus}",
               f"--object-store-memory={self.object_store_bytes}",
               # Fixed ports (each host has its own network namespace, so they never collide):
               # with port 0 the raylet waits for its agents to write their ports to files, and
               # gives up after ~15 s, which a loaded 2-core machine can exceed.
               *(f"--{name}={port + host.ports_offset}" for name, port in NODE_PORTS.items())]
        if host is self.head or host.own_head:
            ray += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        else:
            ray += [f"--address={self.address}"]
        host.log_path = host.base / "ray-start.log"
        with open(host.log_path, "w") as log:
            host.proc = self.popen(host, ray, stdout=log, stderr=subprocess.STDOUT)
        # The raylet gives its agents ~15 s (not configurable) to start. Linux schedules each
        # session as one group (autogroup), so the node's eight-odd Python processes share one
        # session's slice of a busy 2-core machine and take longer than that to import: the
        # node's session starts at a raised priority, set back to normal once it is up.
        _set_group_nice(host.proc.pid, STARTUP_NICE)

    def _wait_ready(self, hosts: list[SimHost]) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        waiting = list(hosts)
        raylet_seen: set[str] = set()
        while waiting:
            for host in list(waiting):
                text = host.log_path.read_text(errors="replace")
                raylet = _has_raylet(host.netns)
                if READY_LINE in text:
                    waiting.remove(host)
                elif host.proc.poll() is not None or (host.name in raylet_seen and not raylet):
                    # `ray start` would go on waiting for a raylet that already died
                    raise SimClusterError(f"The Ray node of simulated host {host.name} ({host.ip}) failed before "
                                          f"it was up; its log ends:\n{_tail(text)}{_raylet_errors(host)}")
                elif raylet:
                    raylet_seen.add(host.name)
            if waiting and time.monotonic() > deadline:
                host = waiting[0]
                raise SimClusterError(f"The Ray node of simulated host {host.name} ({host.ip}) was not up within "
                                      f"{self.ready_timeout_s:.0f} s; its log ends:\n"
                                      f"{_tail(host.log_path.read_text(errors='replace'))}{_raylet_errors(host)}"
                                      f"\n{self.diagnose(host)}")
            time.sleep(0.2)

    def diagnose(self, host: SimHost) -> str:
        """Why a host's node may not reach the head: the head's GCS process, a TCP connect from
        the host to it, the bridge ports' states."""
        gcs = self._gcs_pids()
        probe = _run(["ip", "netns", "exec", host.netns, sys.executable, "-c",
                      "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); "
                      "print('connects')", self.head.ip, str(RAY_PORT)], check=False)
        ports = _run(["ip", "-br", "link", "show", "master", self.bridge], check=False).stdout.strip()
        neighbours = {h.name: _run(["ip", "-n", h.netns, "neigh", "show"], check=False).stdout.strip()
                      for h in (host, self.head)}
        fatal = [line.rstrip() for path in self.head.tmp.glob("ray/session_2*/logs/gcs_server.out")
                 for line in path.read_text(errors="replace").splitlines() if " C " in line or " F " in line]
        return (f"diagnosis: head's gcs_server pids {gcs or 'none'} (fatal lines in its log: {fatal[-3:]}); "
                f"{host.name} -> {self.address}: "
                f"{(probe.stdout or probe.stderr).strip().splitlines()[-1:] or ['no answer']}; "
                f"bridge ports: {ports!r}; neighbours: {neighbours!r}{self.head_report()}")

    def head_report(self) -> str:
        """What the head runs now and, if its `ray start --block` ended (it kills the rest of the
        head when one of its processes exits unexpectedly), the end of its log: which process
        ended first, with what exit code, and that process's own last lines."""
        running = sorted({_comm(pid) for pid in namespace_pids(self.head.netns)} - {""})
        report = f"\nthe head runs: {running}"
        proc = self.head.proc
        if proc is not None and proc.poll() is not None:
            report += (f"\nthe head's `ray start` ended (exit status {proc.returncode}); its log ends:\n"
                       f"{_tail(self.head.log_path.read_text(errors='replace'), 80)}")
        for name in ("ray_process_exit.log", "gcs_server.err", "monitor.err", "raylet.err"):
            for path in self.head.tmp.glob(f"ray/session_2*/logs/{name}"):
                text = path.read_text(errors="replace").strip()
                if text:
                    report += f"\n{path.name} on the head ends:\n{_tail(text, 30)}"
        return report + _raylet_errors(self.head)

    # ---- faults --------------------------------------------------------------------------
    def kill_host(self, host: SimHost) -> int:
        """SIGKILL every process on the host (its Ray node, workers, drivers): a host that died.
        Returns how many processes were killed."""
        return kill_namespace(host.netns)

    def cut_link(self, host: SimHost) -> None:
        """The host's cable pulled: its processes live on and nothing they send arrives."""
        _run(["ip", "link", "set", host.veth, "down"])

    def restore_link(self, host: SimHost) -> None:
        _run(["ip", "link", "set", host.veth, "up"])

    def shape_link(self, host: SimHost, *, rate_mbit: float | None = None, delay_ms: float = 0.0,
                   loss: float = 0.0, seed: int = 0) -> None:
        """The host's link as a slower or worse network, each way: at `rate_mbit` megabits per
        second (a tbf qdisc on both ends of its veth: the bridge side shapes what reaches the host,
        the inner side what it sends), every frame held `delay_ms` and dropped with probability
        `loss` (seeded: the same frames' fates on every run), by a relay process (linkrelay.py:
        this kernel has no netem). Replaces any earlier shaping; bad values raise before anything
        changes. Deleting the namespace (stop, remove_host) removes the qdiscs; stop() the relay."""
        impairment = Impairment(delay_ms=delay_ms, loss=loss, seed=seed)
        if rate_mbit is not None and not 0 < rate_mbit <= MAX_RATE_MBIT:
            raise ValueError(f"rate_mbit must be from above 0 to {MAX_RATE_MBIT} (megabits per second each way), "
                             f"or None for the bridge's own speed; got {rate_mbit!r}")
        self.unshape_link(host)
        if impairment.needed:
            self.relays[host.name] = linkrelay.start(veth=host.veth, tap=f"{self.tag}t{self._index(host)}",
                                                     bridge=self.bridge, netns=host.netns, inner_if=INNER_IF,
                                                     impairment=impairment)
        if rate_mbit is None:
            return
        rate = f"{rate_mbit:g}mbit"
        for argv in (["tc"], ["ip", "netns", "exec", host.netns, "tc"]):
            device = host.veth if len(argv) == 1 else INNER_IF
            _run([*argv, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                  "burst", str(tbf_burst_bytes(rate_mbit)), "latency", f"{TBF_LATENCY_MS}ms"])

    def unshape_link(self, host: SimHost) -> RelayCounts | None:
        """The host's link back at the bridge's own speed, with no delay or loss. Returns what its
        relay counted if it had one, else None."""
        _run(["tc", "qdisc", "del", "dev", host.veth, "root"], check=False)
        _run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", INNER_IF, "root"], check=False)
        proc = self.relays.pop(host.name, None)
        return linkrelay.stop(proc, veth=host.veth, bridge=self.bridge) if proc is not None else None

    def _index(self, host: SimHost) -> int:
        return self._every_host().index(host)

    def restart_host(self, host: SimHost) -> None:
        """The host back again, with a fresh Ray node (a new node id) on new ports (10 above its
        last ones, as a node started with Ray's default random ports would be) and its link up.
        Why new ports: at the same address and port, the head's GCS health-checks the new node
        over the gRPC connection it had to the old one, still in reconnect backoff after the loss.
        Seen here: a health check tuned below that backoff declared the new node dead from its
        first check (benchmarks/multihost.py); with Ray's defaults, the restarted raylet was
        declared dead before it was up (tests/multihost/test_node_loss.py, once in 15 runs)."""
        host.ports_offset += 10
        kill_namespace(host.netns)
        self.restore_link(host)
        self.start_node(host)


# ---- helpers, also for cleaning up after a run that was killed --------------------------
MAX_RATE_MBIT = 100_000
TBF_LATENCY_MS = 50  # how long a packet may wait in the shaper's queue before it is dropped


def tbf_burst_bytes(rate_mbit: float) -> int:
    """tbf needs a bucket of at least rate / HZ bytes to reach its rate (HZ may be 100): 1/100 s
    of traffic, and never less than 64 KB (a few jumbo segments of veth's GSO)."""
    return max(64_000, int(rate_mbit * 1e6 / 8 / 100))


def can_run() -> str | None:
    """None if this machine can host a simulated cluster, else why not (a skip reason)."""
    if sys.platform != "linux":
        return f"simulated hosts need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return ("simulated hosts need root to create network namespaces and a bridge "
                f"(running as uid {os.geteuid()}); CI runs these tests as root")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "simulated hosts need the `ip` (iproute2) and `unshare` (util-linux) commands"
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = _run(["ip", "netns", "add", probe], check=False)
    _run(["ip", "netns", "del", probe], check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace here: {done.stderr.strip()}"
    return None


def namespace_pids(netns: str) -> list[int]:
    """Every process whose network namespace is `netns`: everything that runs on that host."""
    try:
        wanted = os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == wanted:
                    pids.append(int(entry))
            except OSError:  # gone meanwhile, or a kernel thread
                pass
    return pids


def kill_namespace(netns: str, timeout_s: float = 5.0) -> int:
    """Every process of the host at once, as a host that loses power: each is stopped (SIGSTOP)
    first, again for any forked meanwhile, and only then all are SIGKILLed. Killed one by one, a
    process of the host could see another die and act on it before its own turn (a node's worker
    once saw its rank die and reported a plain rank death, cleaning up, before the host was gone)."""
    pids: list[int] = []
    for _ in range(20):  # until no new process appeared while the others were being stopped
        new = [pid for pid in namespace_pids(netns) if pid not in pids]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        pids += new
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while namespace_pids(netns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def remove_leftovers() -> None:
    """Namespaces, bridges and files of earlier simulated clusters whose process is gone."""
    listed = _run(["ip", "netns", "list"], check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)[a-z]?-\S+)", listed, flags=re.M):
        netns, pid = name
        if not _alive(int(pid)):
            kill_namespace(netns)
            _run(["ip", "netns", "del", netns], check=False)
            shutil.rmtree(f"/etc/netns/{netns}", ignore_errors=True)
    for path in Path("/etc/netns").glob(f"{PREFIX}*-*"):
        match = re.match(rf"{PREFIX}(\d+)[a-z]?-", path.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    links = _run(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout
    for bridge, pid in re.findall(rf"\d+: ({PREFIX}(\d+)[a-z]?br)[:@]", links):
        if not _alive(int(pid)):
            _run(["ip", "link", "del", bridge], check=False)
    for path in Path("/tmp").glob(f"{PREFIX}*-*"):
        match = re.match(rf"{PREFIX}(\d+)[a-z]?-", path.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL a process started by SimCluster.popen and its session (whatever it started).
    Only while it is not reaped: after that its pid may belong to someone else."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen) -> None:
    kill_session(proc)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SimClusterError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _set_group_nice(session_leader: int, niceness: int) -> None:
    """The scheduling weight of a whole session (sched_autogroup); plain `nice` only orders
    processes within their session's group. Without autogroup, nothing to do."""
    try:
        Path(f"/proc/{session_leader}/autogroup").write_text(str(niceness))
    except OSError:  # no autogroup on this kernel, or the process is gone
        pass


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""


def _has_raylet(netns: str) -> bool:
    return any(_comm(pid) == "raylet" for pid in namespace_pids(netns))


def _raylet_errors(host: SimHost) -> str:
    """The raylet's fatal lines: why a node did not come up is often only there."""
    lines = []
    for path in host.tmp.glob("ray/session_2*/logs/raylet.out"):  # not session_latest, the same again
        lines += [line.rstrip() for line in path.read_text(errors="replace").splitlines()
                  if " C " in line or " E " in line]
    return (f"\n{host.name}'s raylet errors:\n" + "\n".join(lines[-5:])) if lines else ""


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])
