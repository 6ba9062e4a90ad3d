"""The root launcher without a hub (gpusession/launcher/): real Unix accounts made for the module
(a unique prefix, removed on every path), a real launcher started as root with a clean
environment, and a client run as the service account that asks it for ranks as a worker actor
does (launcher_client.py). Needs root, as CI runs, and the hub's installed environment
(`scripts/setup --hub`): ranks run as other accounts, which must read the Python they run."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from gpusession.hub.plan import HubLayout
from gpusession.launcher.__main__ import socket_path

from ..accounts import add_account, remove_accounts
from .conftest import PREFIX, installed_matches_checkout, needs_root_and_setup

CLIENT = Path(__file__).with_name("launcher_client.py")
SERVICE_TMP = "service-tmp"  # the clients' TMPDIR, inside the test's folder: what they leave goes with it
PYTHON = str(HubLayout(PREFIX, Path("/"), "x").python)  # every account may read it


class Node:
    def __init__(self, base: Path, service: str, ann: str, bob: str) -> None:
        self.base, self.service, self.ann, self.bob = base, service, ann, bob
        self.socket = socket_path(base / "launcher")
        self.bare_socket = socket_path(base / "bare")  # a launcher told to use no cgroup (the fallback)

    def client(self, account: str, code: str, *, cwd: str = "/", bare: bool = False) -> subprocess.Popen:
        """A worker actor's requests, made as the service account."""
        entry = pwd.getpwnam(self.service)
        where = self.bare_socket if bare else self.socket
        return subprocess.Popen([PYTHON, str(CLIENT), str(where), account, code], cwd="/",
                                user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={"PATH": "/usr/bin:/bin", "CALLER_CWD": cwd, "HOME": "/",
                                     "TMPDIR": str(self.base / SERVICE_TMP)})

    def run(self, account: str, code: str, **kwargs) -> dict:
        proc = self.client(account, code, **kwargs)
        out, err = proc.communicate(timeout=240)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert lines, f"the client said nothing (exit {proc.returncode}): {err[-2000:]}"
        return lines[-1]


@pytest.fixture(scope="module")
def node():
    reason = needs_root_and_setup()
    if reason:
        pytest.skip(reason)
    stale = installed_matches_checkout(HubLayout(PREFIX, Path("/"), "x"))
    if stale:
        pytest.fail(stale)
    prefix = f"gsl{os.getpid() % 100000}"
    names = [f"{prefix}s", f"{prefix}a", f"{prefix}b"]
    base = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    os.chmod(base, 0o755)
    launchers = []
    try:
        add_account(names[0], system=True)
        add_account(names[1], system=False)
        add_account(names[2], system=False)
        service = pwd.getpwnam(names[0])
        os.mkdir(base / SERVICE_TMP, 0o700)
        os.chown(base / SERVICE_TMP, service.pw_uid, service.pw_gid)
        env = {"PATH": f"{Path(PYTHON).parent}:/usr/bin:/bin", "LANG": "C.UTF-8",
               "GPUSESSION_ADMIN_TOKEN": "poison-never-in-a-rank"}  # what a careless start might pass on
        for name, extra in (("launcher", []), ("bare", ["--no-cgroups"])):
            launchers.append(subprocess.Popen(
                [PYTHON, "-m", "gpusession.launcher", "--dir", str(base / name), "--service-user", names[0], *extra],
                cwd="/", env=env, text=True, stdout=subprocess.PIPE, stderr=open(base / f"{name}.log", "w")))
        for launcher, want in zip(launchers, ("cgroup2", "none")):
            ready = json.loads(launcher.stdout.readline() or '{"failed": "no answer"}')
            assert "ready" in ready, f"{ready}: {(base / 'launcher.log').read_text()[-2000:]}"
            assert ready["ready"]["cgroups"] in ((want, "cgroup v1 freezer") if want != "none" else ("none",)), ready
        yield Node(base, *names)
    finally:
        for launcher in launchers:
            launcher.terminate()
            try:
                launcher.wait(30)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
        remove_accounts(names)
        shutil.rmtree(base, ignore_errors=True)


WHO_AM_I = """
def fn():
    import os, tempfile
    mine = os.path.join(os.environ["HOME"], "mine.txt")
    wrote = os.path.join(os.environ["HOME"], "written-by-rank.txt")
    open(wrote, "w").write("x")
    scratch = tempfile.gettempdir()
    found = os.stat(scratch)
    return {"scratch_owner": found.st_uid, "scratch_mode": found.st_mode & 0o777, "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "env": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(0o077), "read": open(mine).read(),
            "wrote": wrote, "scratch": scratch,
            "fds": [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                    if os.path.exists(f"/proc/self/fd/{fd}")],
            "cmdline_env": open("/proc/self/environ", "rb").read().decode(errors="replace")}
"""


def test_bobs_rank_runs_as_bob_reads_his_0600_file_and_what_it_writes_is_his(node):
    bob = pwd.getpwnam(node.bob)
    mine = Path(bob.pw_dir) / "mine.txt"
    mine.write_text("42")
    os.chown(mine, bob.pw_uid, bob.pw_gid)
    os.chmod(mine, 0o600)
    os.chmod(bob.pw_dir, 0o700)
    said = node.run(node.bob, WHO_AM_I, cwd=bob.pw_dir)
    assert "value" in said, said
    seen = said["value"]
    assert (seen["uid"], seen["euid"], seen["gid"]) == (bob.pw_uid, bob.pw_uid, bob.pw_gid)
    assert set(seen["groups"]) == {bob.pw_gid}, seen["groups"]  # his groups only: none of root's
    assert seen["read"] == "42" and seen["cwd"] == bob.pw_dir and seen["umask"] == 0o077
    assert (seen["env"]["HOME"], seen["env"]["USER"], seen["env"]["LOGNAME"]) == (bob.pw_dir, node.bob, node.bob)
    assert "poison" not in json.dumps(seen["env"]) and "poison" not in seen["cmdline_env"]
    assert not any("TOKEN" in key or key.startswith("RAY_") for key in seen["env"]), sorted(seen["env"])
    assert not [fd for fd in seen["fds"] if "launcher" in fd], seen["fds"]  # not its log, listener or others' files
    assert os.stat(seen["wrote"]).st_uid == bob.pw_uid
    assert (seen["scratch_owner"], seen["scratch_mode"]) == (bob.pw_uid, 0o700), seen["scratch"]
    assert said["status"] == [0, None], said
    assert not os.path.exists(seen["scratch"]), "bob's temporary directory outlived his last rank on the node"


def test_a_rank_whose_user_may_not_enter_the_callers_folder_starts_in_its_home(node):
    ann = pwd.getpwnam(node.ann)
    os.chmod(ann.pw_dir, 0o700)
    said = node.run(node.bob, "def fn():\n    import os\n    return os.getcwd()\n", cwd=ann.pw_dir)
    assert said["value"] == pwd.getpwnam(node.bob).pw_dir, said


def test_root_the_service_account_system_and_unknown_accounts_are_refused_by_name(node):
    for account, why in (("root", "never runs a rank as root"), (node.service, "service account"),
                         ("daemon", "below the launcher's floor 1000"), (f"{node.bob}-nobody", "does not exist on node")):
        said = node.run(account, "def fn():\n    return 1\n")
        assert "refused" in said, (account, said)
        assert f"{account!r}" in said["refused"] and why in said["refused"], said


DAEMON = """
def fn():
    import os, time
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: reparented away from the rank, in no group of its
            os.write(write, str(os.getpid()).encode())
            time.sleep(600)
        os._exit(0)
    os.close(write)
    return int(os.read(read, 32))
"""


@pytest.mark.parametrize("bare", [False, True], ids=["cgroup", "subreaper-fallback"])
def test_a_double_forked_setsid_process_of_bobs_is_gone_when_his_rank_ends(node, bare):
    said = node.run(node.bob, DAEMON, bare=bare)
    left = said["value"]
    gone = not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE
    assert gone, f"bob's daemon {left} outlived his rank: {psutil.Process(left).as_dict(['uids', 'ppid', 'status'])}"


def test_bobs_rank_cannot_read_anns_environ_signal_her_rank_or_list_her_scratch(node):
    ann = node.client(node.ann, "def fn():\n    import time\n    time.sleep(120)\n")
    try:
        first = json.loads(ann.stdout.readline())
        assert "forked" in first, first
        ann_scratch = node.base / "launcher" / "scratch" / str(pwd.getpwnam(node.ann).pw_uid)
        attack = f"""
def fn():
    import os, signal
    tried = {{}}
    for name, act in (("environ", lambda: open("/proc/{first['forked']}/environ").read()),
                      ("signal", lambda: os.kill({first['forked']}, signal.SIGKILL)),
                      ("scratch", lambda: os.listdir({str(ann_scratch)!r}))):
        try:
            act()
            tried[name] = "done"
        except PermissionError:
            tried[name] = "refused"
    return tried
"""
        said = node.run(node.bob, attack)
        assert said.get("value") == {"environ": "refused", "signal": "refused", "scratch": "refused"}, said
        assert psutil.Process(first["forked"]).uids().real == pwd.getpwnam(node.ann).pw_uid
    finally:
        ann.kill()  # her worker actor gone: the launcher kills her rank
        ann.wait()


def test_only_the_service_account_reaches_the_launcher(node):
    """A user (a rank of theirs) cannot even reach the socket's directory; root, who can, is
    hung up on: SO_PEERCRED names the service account only."""
    bob = pwd.getpwnam(node.bob)
    reach = subprocess.run([PYTHON, "-c", f"import socket; s = socket.socket(socket.AF_UNIX); "
                            f"s.connect({str(node.socket)!r})"], user=bob.pw_uid, group=bob.pw_gid,
                           extra_groups=[], capture_output=True, text=True, cwd="/")
    assert reach.returncode != 0 and "PermissionError" in reach.stderr, reach.stderr
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(node.socket))
        assert sock.recv(100) == b"", "the launcher answered root"


DEEP_AND_WIDE = """
def fn():
    import os, tempfile
    os.chdir(tempfile.gettempdir())
    for i in range(3000):  # many files, and a tree deeper than a recursive walk allows (1000 frames)
        open(f"f{i}", "w").close()
    for _ in range(1500):
        os.mkdir("d")
        os.chdir("d")
    return tempfile.gettempdir()
"""


def test_a_users_huge_deep_scratch_folder_is_removed_and_the_launcher_serves_the_next_rank(node):
    said = node.run(node.bob, DEEP_AND_WIDE)
    assert said.get("status") == [0, None], said
    folder = Path(said["value"])
    assert not folder.exists()  # renamed aside at once, for removal apart from the launcher
    nxt = node.run(node.ann, "def fn():\n    return 7\n")  # the launcher serves the next rank
    assert nxt.get("value") == 7, nxt
    deadline = time.monotonic() + 60
    while list(folder.parent.glob(".removing-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(folder.parent.glob(".removing-*")) == [], "the folder set aside was not removed within 60 s"


LIMITS_SEEN = """
def fn():
    import resource
    return {"nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "core": resource.getrlimit(resource.RLIMIT_CORE)}
"""


@contextmanager
def limits_file(node: Node, text: str):
    """A real /etc/security/limits.d file, naming only this module's accounts (no `*`: a login on
    this machine meanwhile must not get them), removed on every path."""
    path = Path("/etc/security/limits.d") / f"{node.service[:-1]}-test.conf"
    path.write_text(text)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def test_bobs_rank_starts_with_the_limits_limits_conf_gives_him_and_anns_are_untouched(node):
    before = node.run(node.ann, LIMITS_SEEN)  # the launcher's own, which her ranks inherit
    bob_group = pwd.getpwnam(node.bob).pw_gid
    text = (f"{node.bob} soft nofile 1234\n{node.bob} hard nofile 4321\n"
            f"@:{bob_group} hard nofile 9999  # a group entry: bob's own wins\n"
            f"{node.bob} soft core 0\n{node.bob} hard core 1024\n")
    with limits_file(node, text):
        bob = node.run(node.bob, LIMITS_SEEN)
        ann = node.run(node.ann, LIMITS_SEEN)
    assert bob.get("value") == {"nofile": [1234, 4321], "core": [0, 1024 * 1024]}, bob
    assert "value" in before and ann.get("value") == before["value"], (before, ann)


def test_a_user_limits_conf_gives_maxlogins_0_gets_no_rank_and_is_told_which_entry(node):
    with limits_file(node, f"{node.ann} - maxlogins 0\n") as path:
        said = node.run(node.ann, "def fn():\n    return 1\n")
    assert "refused" in said, said
    assert f"{path}:1" in said["refused"] and "maxlogins 0" in said["refused"] and repr(node.ann) in said["refused"]
    assert node.run(node.ann, "def fn():\n    return 1\n").get("value") == 1  # the entry gone: she runs again


def test_a_user_added_to_group_root_is_refused_naming_the_group(node):
    subprocess.run(["gpasswd", "--add", node.ann, "root"], check=True, capture_output=True)
    try:
        said = node.run(node.ann, "def fn():\n    return 1\n")
    finally:
        subprocess.run(["gpasswd", "--delete", node.ann, "root"], check=True, capture_output=True)
    assert "refused" in said and "group root (gid 0)" in said["refused"] and repr(node.ann) in said["refused"], said
