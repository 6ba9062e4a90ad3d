"""A hub on several hosts (issue 28, item 6): `gpusession hub --ray-ip` on the simulated head and
`gpusession hub node` on simulated hosts, each node with root's launcher of its own; a user's run
through the gateway. host2 does not know the user: its node command runs in a mount namespace of
its own (private: no mount of the machine's reaches it) whose /etc is an overlay with a passwd
and group without that account, so its launcher finds no such user (a real mechanism, no mock). Needs root, namespaces and `scripts/setup --hub`
(ranks run as the user, who must read the Python they run).

This module makes its own network (no Ray nodes of simcluster's): the session's simulated
cluster is not started for it (whole_cluster is overridden below), and the file's name puts it after
the modules that take that cluster (conftest.py stops it after the last of them)."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpusession.hub.node import STOP_TIMEOUT_S
from gpusession.hub.plan import HubLayout
from gpusession.run import bulk

from ..accounts import add_account, remove_accounts, uid_of
from ..hub.conftest import PREFIX, installed_matches_checkout, needs_root_and_setup, stop_hub, wait_for_line
from .simcluster import SimCluster, can_run, namespace_pids

READY_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 400.0
PYTHON = str(HubLayout(PREFIX, Path("/"), "x").python)  # every account may read it
TUNING = {"RAY_agent_register_timeout_ms": "120000"}  # a loaded machine starts a node's agents slowly

# ann's script: a call through the gateway (no Ray address), each rank says where and as whom it ran
RUN_AS_USER = textwrap.dedent("""
    import json, os, socket, sys
    os.chdir(os.path.expanduser("~"))
    import gpusession as gs

    @gs.distributed(gpus=int(sys.argv[1]), placement="strict_spread", return_all=True)
    def where():
        return {"host": socket.gethostname(), "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid()}

    try:
        print("RESULT", json.dumps({"ranks": where()}), flush=True)
    except Exception as exc:
        print("RESULT", json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    cluster = gs.status().cluster
    print("FREE", json.dumps({"free": cluster["gpus_free"], "total": cluster["gpus_total"], "lost": cluster["gpus_lost"],
                              "open": [l for l in gs.status().leases if l["state"] != "ended"]}), flush=True)
""")


@pytest.fixture(scope="module")
def whole_cluster():
    """Overrides conftest's: this module makes its own simulated hosts, with the hub's nodes."""
    yield None


class HubOnHosts:
    def __init__(self, cluster: SimCluster, base: Path, service: str, ann: str, *, without_ann: tuple[str, ...]) -> None:
        self.cluster, self.base, self.service, self.ann = cluster, base, service, ann
        self.without_ann = without_ann  # hosts whose passwd and group lack ann
        self.hub = None
        self.nodes: dict[str, subprocess.Popen] = {}
        self.address = ""
        self.token_path = Path()

    def layout(self, host: str) -> HubLayout:
        return HubLayout(PREFIX, self.base / host, self.service, self.ray_tmp(host))

    def ray_tmp(self, host: str) -> Path:
        return Path(f"/tmp/{self.cluster.tag}{host}")  # short: Ray's socket paths

    def env(self, host) -> dict:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(host.home),
                "LANG": "C.UTF-8", **TUNING}

    def log(self, host: str) -> str:
        return (self.layout(host).hub_dir / "launcher.log").read_text(errors="replace")[-3000:]

    def output(self, host: str) -> Path:
        return self.base / f"{host}-output.txt"

    def start_hub(self) -> None:
        head = self.cluster.head
        with open(self.output("head"), "w") as out:
            self.hub = self.cluster.popen(
                head, [sys.executable, "-m", "gpusession.cli", "hub", "--ray-ip", head.ip, "--gpus", "1",
                       "--prefix", str(PREFIX), "--state-dir", str(self.layout("head").state),
                       "--service-user", self.service], env=self.env(head), stdout=out, stderr=subprocess.STDOUT)
        wait_for_line(self.output("head"), "gpusession hub: ready:", self.hub, READY_TIMEOUT_S)
        joined = re.search(r"hub node --address (\S+) --token-file - < (\S+)", self.output("head").read_text())
        assert joined, f"the hub printed no join command:\n{self.output('head').read_text()[-3000:]}"
        self.address, self.token_path = joined.group(1), Path(joined.group(2))

    def node_argv(self, name: str) -> list[str]:
        """The join command the hub printed, with this simulated host's address and folders."""
        host, layout = self.cluster.host(name), self.layout(name)
        argv = [sys.executable, "-m", "gpusession.cli", "hub", "node", "--address", self.address, "--token-file", "-",
                "--node-ip", host.ip, "--gpus", "2", "--prefix", str(PREFIX), "--state-dir", str(layout.state),
                "--service-user", self.service, "--temp-dir", str(layout.ray_tmp)]
        return self.without_user(name, argv) if name in self.without_ann else argv

    def start_node(self, name: str) -> subprocess.Popen:
        host = self.cluster.host(name)
        argv = self.node_argv(name)
        with open(self.output(name), "w") as out, open(self.token_path) as token:
            proc = self.cluster.popen(host, argv, env=self.env(host), stdin=token, stdout=out,
                                      stderr=subprocess.STDOUT)
        self.nodes[name] = proc
        wait_for_line(self.output(name), "gpusession hub node: joined", proc, READY_TIMEOUT_S)
        return proc

    def without_user(self, name: str, argv: list[str]) -> list[str]:
        """argv in a private mount namespace whose /etc is an overlay of this machine's with a
        passwd and group that lack ann (and the host's own hosts file, which the overlay would
        hide). Not a bind mount on /etc/passwd itself: any useradd on the machine renames a new
        file over /etc/passwd, and the kernel then detaches mounts on it in every namespace."""
        upper, work = self.base / f"{name}-etc" / "upper", self.base / f"{name}-etc" / "work"
        upper.mkdir(parents=True)
        work.mkdir()
        for table in ("passwd", "group"):
            (upper / table).write_text(_without(f"/etc/{table}", self.ann))
            (upper / table).chmod(0o644)
        shutil.copyfile(f"/etc/netns/{self.cluster.host(name).netns}/hosts", upper / "hosts")
        (upper / "hosts").chmod(0o644)
        overlay = 'mount -t overlay gsn-etc -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", overlay, "sh", str(upper),
                str(work), *argv]

    def only(self, *names: str) -> None:
        """Exactly these hosts' nodes joined (each test says which it needs: any order works)."""
        for name, proc in list(self.nodes.items()):
            if name not in names:
                stop_node(proc)
                del self.nodes[name]
        for name in names:
            if name not in self.nodes:
                self.start_node(name)

    def run_as_ann(self, gpus: int) -> tuple[dict, dict]:
        """ann's call through the gateway, on the head: its RESULT and what gs.status() said after."""
        account = pwd.getpwnam(self.ann)
        env = {"GPUSESSION_GATEWAY": str(self.layout("head").gateway_socket), "HOME": account.pw_dir,
               "USER": self.ann, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        proc = self.cluster.popen(self.cluster.head, ["setpriv", f"--reuid={account.pw_uid}",
                                                      f"--regid={account.pw_gid}", "--init-groups", "--",
                                                      PYTHON, "-c", RUN_AS_USER, str(gpus)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"ann's run did not end within {RUN_TIMEOUT_S:.0f} s:\n{out[-4000:]}")
        lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                 if line.startswith(("RESULT ", "FREE "))}
        assert proc.returncode == 0 and "FREE" in lines, f"ann's script failed ({proc.returncode}):\n{out[-4000:]}"
        return lines["RESULT"], lines["FREE"]

    def stop(self) -> None:
        """The nodes (SIGTERM, as systemd would), then the hub (SIGINT, as Ctrl-C): each stops what
        it started by pid."""
        for proc in self.nodes.values():
            stop_node(proc)
        if self.hub is not None:
            stop_hub(self.hub)


def stop_node(proc: subprocess.Popen, timeout_s: float = 120.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _without(path: str, name: str) -> str:
    """/etc/passwd or /etc/group without `name`'s line (its own group) and without it as a member."""
    kept = []
    for line in Path(path).read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            continue
        if path.endswith("group") and len(fields) == 4:
            fields[3] = ",".join(member for member in fields[3].split(",") if member and member != name)
        kept.append(":".join(fields))
    return "\n".join(kept) + "\n"


@pytest.fixture(scope="module")
def hub_hosts():
    reason = can_run() or needs_root_and_setup()
    if reason:
        pytest.skip(reason)
    stale = installed_matches_checkout(HubLayout(PREFIX, Path("/"), "x"))
    if stale:
        pytest.fail(stale)
    cluster = SimCluster(hosts=2)
    tag = f"gsn{os.getpid() % 100000}"
    service, ann = f"{tag}s", f"{tag}a"
    base = Path(f"/tmp/{tag}-state")  # 0755, root's: ann reaches the gateway's socket under it
    hosts = None
    try:
        base.mkdir(mode=0o755)
        cluster.start(nodes=False)
        add_account(service, system=True, shell="/usr/sbin/nologin")
        add_account(ann, system=False)
        hosts = HubOnHosts(cluster, base, service, ann, without_ann=("host2",))
        hosts.start_hub()
        yield hosts
    finally:
        if hosts is not None:
            hosts.stop()
        cluster.stop()  # whatever still ran on a host (by namespace), the namespaces, /etc/netns/<ns>/
        service_uid = uid_of(service)
        remove_accounts([ann, service])
        if service_uid is not None and bulk.NODE_ROOT:  # the service's node folder (hosts share /dev/shm)
            shutil.rmtree(os.path.join(bulk.NODE_ROOT, f"gpusession-{service_uid}"), ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        for name in ("head", "host1", "host2"):
            shutil.rmtree(f"/tmp/{cluster.tag}{name}", ignore_errors=True)
        shutil.rmtree(f"/tmp/gsh-{service}", ignore_errors=True)


# In file order host2 first, then host1 for the rest: each node starts once (a node's start takes
# half a minute here). Each test still says which nodes it needs (`only`), so any order works.
def test_a_node_that_does_not_know_the_user_fails_the_call_naming_node_and_user(hub_hosts):
    """host2 joins, its passwd without ann: a 2-rank call on the head and host2 fails, naming host2
    and ann, and every GPU is free again."""
    hub_hosts.only("host2")
    launcher = int(re.search(r"the launcher runs \(pid (\d+)\)", hub_hosts.output("host2").read_text()).group(1))
    seen = Path(f"/proc/{launcher}/root/etc/passwd").read_text()  # /etc/passwd as host2's launcher reads it
    assert f"\n{hub_hosts.ann}:" not in f"\n{seen}" and f"\n{hub_hosts.service}:" in f"\n{seen}"
    looked_up = subprocess.run(["nsenter", "-t", str(launcher), "-m", "getent", "passwd", hub_hosts.ann],
                               capture_output=True, text=True)
    assert looked_up.returncode == 2, looked_up  # getent: no such key
    result, after = hub_hosts.run_as_ann(2)
    assert result.get("error") == "LaunchRefused", f"{result}\nhost2's launcher log:\n{hub_hosts.log('host2')}"
    assert f"the user {hub_hosts.ann!r} does not exist on node host2" in result["message"]
    # A node the previous test stopped may still be listed by Ray (until it declares it dead) and
    # count as lost, its GPUs unavailable (seen in CI: 3 of 5 free, host2's 2 lost): every GPU
    # of a node that answers is free again.
    assert after["open"] == [] and after["free"] == after["total"] - after["lost"], after


def test_the_hub_keeps_rays_token_for_root_alone_and_a_node_gets_it_on_no_command_line(hub_hosts):
    hub_hosts.only("host1")
    found = os.stat(hub_hosts.token_path)
    assert found.st_uid == 0 and found.st_mode & 0o777 == 0o600
    token = hub_hosts.token_path.read_text().strip()
    host1 = hub_hosts.cluster.host("host1")
    for pid in namespace_pids(host1.netns):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        assert token.encode() not in cmdline, f"Ray's token is on the command line of {pid} on host1"


def test_a_users_run_on_a_joined_node_runs_as_that_user_there(hub_hosts):
    """Two ranks, one per host (strict_spread): the head's and host1's, each started by its own
    node's launcher as ann."""
    hub_hosts.only("host1")
    result, after = hub_hosts.run_as_ann(2)
    ann = pwd.getpwnam(hub_hosts.ann)
    assert "ranks" in result, result
    assert sorted(rank["host"] for rank in result["ranks"]) == ["head", "host1"]
    assert all(rank["uid"] == rank["euid"] == ann.pw_uid and rank["gid"] == ann.pw_gid for rank in result["ranks"])
    # A node the previous test stopped may still be listed by Ray (until it declares it dead) and
    # count as lost, its GPUs unavailable (seen in CI: 3 of 5 free, host2's 2 lost): every GPU
    # of a node that answers is free again.
    assert after["open"] == [] and after["free"] == after["total"] - after["lost"], after


def test_a_node_that_leaves_stops_its_ray_node_and_its_launcher(hub_hosts):
    hub_hosts.only("host1")
    host1 = hub_hosts.cluster.host("host1")
    proc = hub_hosts.nodes.pop("host1")
    assert namespace_pids(host1.netns)  # its launcher and Ray node run
    asked = time.monotonic()
    assert stop_node(proc) == 0
    left_after = time.monotonic() - asked
    # its Ray stopped on the SIGTERM, not killed once the command's stop timeout ran out (Ray's own
    # drain waits 30 s for a node to fall idle; the command turns it off)
    assert left_after < STOP_TIMEOUT_S, f"the node took {left_after:.1f} s to leave"
    assert "leaving the cluster" in hub_hosts.output("host1").read_text()
    assert [psutil.Process(pid).name() for pid in namespace_pids(host1.netns) if psutil.pid_exists(pid)] == []


def test_a_node_whose_output_pipe_loses_its_reader_leaves_with_status_0_and_stops_what_it_started(hub_hosts):
    """`ssh root@NODE gpusession hub node ...` as the docs show it has no terminal: when the admin's
    ssh ends (Ctrl-C there, a dropped link), sshd sends the command no signal, it only closes the
    pipe the command writes to. Here that pipe's reader is the test, and it closes it."""
    hub_hosts.only()
    host1 = hub_hosts.cluster.host("host1")
    with open(hub_hosts.token_path) as token:
        proc = hub_hosts.cluster.popen(host1, hub_hosts.node_argv("host1"), env=hub_hosts.env(host1), stdin=token,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hub_hosts.nodes["host1"] = proc  # stopped by the fixture should this test fail
    said = []
    for line in proc.stdout:  # (pytest-timeout ends a node that never joins)
        said.append(line)
        if line.startswith("gpusession hub node: joined"):
            break
    assert said and said[-1].startswith("gpusession hub node: joined"), "".join(said)[-3000:]
    assert namespace_pids(host1.netns)  # its launcher and Ray node run
    proc.stdout.close()
    asked = time.monotonic()
    assert proc.wait(timeout=STOP_TIMEOUT_S + 30) == 0
    assert time.monotonic() - asked < STOP_TIMEOUT_S
    hub_hosts.nodes.pop("host1")
    assert [psutil.Process(pid).name() for pid in namespace_pids(host1.netns) if psutil.pid_exists(pid)] == []


def test_a_node_with_another_starts_token_fails_naming_the_address_and_leaves_nothing(hub_hosts):
    """A token of an earlier start of the hub (here, a made-up one): Ray refuses the node, and the
    command says why from its log and stops its launcher."""
    hub_hosts.only()
    host = hub_hosts.cluster.host("host1")
    layout = hub_hosts.layout("host1")
    with open(hub_hosts.output("host1"), "w") as out:
        proc = hub_hosts.cluster.popen(
            host, [sys.executable, "-m", "gpusession.cli", "hub", "node", "--address", hub_hosts.address,
                   "--token-file", "-", "--node-ip", host.ip, "--prefix", str(PREFIX), "--state-dir", str(layout.state),
                   "--service-user", hub_hosts.service, "--temp-dir", str(layout.ray_tmp)],
            env=hub_hosts.env(host), stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True)
    proc.communicate("0" * 64 + "\n", timeout=READY_TIMEOUT_S)
    said = hub_hosts.output("host1").read_text()
    assert proc.returncode == 1 and f"did not join the hub's cluster at {hub_hosts.address}" in said, said
    assert "token is missing or incorrect" in said  # Ray's own words, from the node's log
    assert namespace_pids(host.netns) == []
