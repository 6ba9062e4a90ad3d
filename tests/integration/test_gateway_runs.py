"""Runs through the gateway (issue 28): a kernel with GPUSESSION_GATEWAY and no Ray address calls
`@gs.distributed`; the run path runs in a gateway process (a Ray driver of the session's cluster)
that never unpickles what the kernel sent. One gateway host, as the hub's service runs it
(`gateway`, tests/integration/conftest.py: shared with test_gateway_lease and test_detach); a few
key tests run against a user's own gateway too (usergateway.py: the same process, run as the
kernel's own account), the other hosting of the same run path (issue 28 item 3)."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from gpusession.broker import client

from ..accounts import add_account, remove_accounts
from ..conftest import CLUSTER_GPUS, ROOT, free_gpus, wait_for

FREE_WITHIN_S = 5.0  # SPEC: a kernel that dies frees its GPUs within 5 s

# The interpreter lives where only root may read (here, under /root): the kernel imports what its
# call needs as root, then becomes the account for good (groups, gid, uid) before it connects.
DROP_TO_ACCOUNT = """
import getpass, os, pwd
import numpy
import gpusession as gs
import gpusession.observe.console, gpusession.gateway.remote, gpusession.observe.receipt, gpusession.observe.renderer
import gpusession.run.bulk, gpusession.api.distributed, gpusession.run.caller.kernelcell, gpusession.run.shipping
gpusession.run.shipping.local_modules()  # reads every installed package's metadata (cached)
import gpusession.cli.main, gpusession.cli.runs  # the shell's command, run in-process by test_detach
account = pwd.getpwnam(os.environ["GS_TEST_ACCOUNT"])
os.setgroups([])
os.setgid(account.pw_gid)
os.setuid(account.pw_uid)
os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
"""

# What every kernel script begins with: a recorder of its observer's events beside the console.
PRELUDE = """
import json, sys, threading
import gpusession as gs
from gpusession.observe import events
from gpusession.observe.console import ConsoleObserver

EVENTS = []
STOP_ON = []  # a text: the observer's poll raises KeyboardInterrupt once a rank printed it

class Recorder(events.Fanout):
    def __init__(self, workers):
        super().__init__(ConsoleObserver(workers))
        self.seen = ""
    def requesting(self, gpus, workers): EVENTS.append("requesting"); super().requesting(gpus, workers)
    def queued(self, view, elapsed_s): EVENTS.append("queued"); super().queued(view, elapsed_s)
    def granted(self, info): EVENTS.append("granted"); super().granted(info)
    def output(self, rank, stream, text):
        EVENTS.append("output"); self.seen += text; super().output(rank, stream, text)
    def report(self, metrics, info): EVENTS.append("report"); super().report(metrics, info)
    def running(self, info): EVENTS.append("running"); super().running(info)
    def released(self, info): EVENTS.append("released"); super().released(info)
    def finished(self, info, error): EVENTS.append("finished"); super().finished(info, error)
    def poll(self):
        if STOP_ON and STOP_ON[0] in self.seen:
            raise KeyboardInterrupt("stop button")

events.set_observer_factory(Recorder)

def say(**fields):
    print("RESULT " + json.dumps(fields), flush=True)
"""


class Kernel:
    """A kernel-like process: by default a hub user's (GPUSESSION_GATEWAY set, no Ray address, no
    gpusession home); `env` may name another hosting's variables instead (a Ray address)."""

    def __init__(self, gateway: str | None, code: str, account: pwd.struct_passwd | None = None,
                 env: dict | None = None) -> None:
        hosting = {"GPUSESSION_GATEWAY": gateway} if env is None else env
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GPUSESSION_HOME", "GPUSESSION_GATEWAY")}
        env.update(hosting, PYTHONUNBUFFERED="1")
        prefix = ""
        if account is not None:  # another account's kernel: it drops to that account before it connects
            env.update(GS_TEST_ACCOUNT=account.pw_name, PYTHONDONTWRITEBYTECODE="1")
            prefix = DROP_TO_ACCOUNT
        self.proc = subprocess.Popen([sys.executable, "-c", prefix + PRELUDE + textwrap.dedent(code)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=str(ROOT))
        self.lines: list[str] = []

    def tell(self, line: str = "go") -> None:
        """A line on the kernel's stdin: what a script waiting in sys.stdin.readline() goes on at."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_for_line(self, prefix: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return line.strip()
        self.proc.kill()
        pytest.fail(f"the kernel never printed {prefix!r}; output:\n{''.join(self.lines)}")

    def result(self, timeout: float = 120.0) -> dict:
        found = json.loads(self.wait_for_line("RESULT ", timeout)[len("RESULT "):])
        self.proc.wait(30)
        return found

    def kill(self) -> float:
        killed_at = time.monotonic()
        self.proc.kill()
        self.proc.wait()
        return killed_at


@pytest.fixture
def kernel(gateway):
    started: list[Kernel] = []

    def start(code: str, account: pwd.struct_passwd | None = None) -> Kernel:
        started.append(Kernel(gateway, code, account))
        return started[-1]

    yield start
    for k in started:
        if k.proc.poll() is None:
            k.kill()


# ----- a user's own gateway (usergateway.py): the other hosting of the same run path -----------------
def user_kernel_env(cluster, home: str, **extra: str) -> dict:
    """What a kernel of `gpusession lab` has: the cluster's address, its own gpusession home."""
    return {"RAY_ADDRESS": cluster.address, "GPUSESSION_HOME": home, **extra}


def start_user_gateway(cluster, home: str, **extra: str) -> str:
    """This account's own gateway for the session cluster, started as a first detach starts it
    (usergateway.ensure()) by a process that then exits; its socket."""
    env = {k: v for k, v in os.environ.items() if k != "GPUSESSION_GATEWAY"}
    env.update(user_kernel_env(cluster, home, **extra))
    done = subprocess.run([sys.executable, "-c", "from gpusession.gateway import usergateway\n"
                           "print('SOCKET', usergateway.ensure(), flush=True)"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=400)
    if done.returncode != 0 or not done.stdout.startswith("SOCKET "):
        pytest.fail(f"the user's gateway did not start: {done.stdout}{done.stderr}")
    return done.stdout.split()[1]


def user_gateway_pids(home: str) -> list[int]:
    from gpusession.gateway import usergateway

    found = [usergateway.record(folder) for folder in (Path(home) / usergateway.GATEWAYS_DIR).glob("*")]
    return [int(r["pid"]) for r in found if r]


def stop_user_gateways(home: str) -> None:
    """End the gateways a test's kernels started under `home` (by the pid each recorded)."""
    from gpusession.cluster.localhead import terminate

    for pid in user_gateway_pids(home):
        terminate(pid, timeout_s=15)


@pytest.fixture(scope="module")
def user_home():
    """A gpusession home of this account's for the user's own gateway (removed with what it holds)."""
    home = tempfile.mkdtemp(prefix="gs-user-home-")
    yield home
    stop_user_gateways(home)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module", params=["hub", "user"])
def hosted_gateway(request, cluster, user_home):
    """The socket of either hosting: the hub's (the module's gateway host, as the service, for any
    account) or a user's own (usergateway.py, run as this account, root, for it alone)."""
    if request.param == "hub":
        return request.getfixturevalue("gateway")
    return start_user_gateway(cluster, user_home)


@pytest.fixture
def any_kernel(hosted_gateway):
    started: list[Kernel] = []

    def start(code: str) -> Kernel:
        started.append(Kernel(hosted_gateway, code))
        return started[-1]

    yield start
    for k in started:
        if k.proc.poll() is None:
            k.kill()


def gpus_free_everywhere(broker, admin) -> bool:
    return free_gpus() == CLUSTER_GPUS and not client.call(broker.leases, admin)


def kill_and_see_gpus_freed(k: Kernel, broker, admin, *, what: str) -> None:
    """SIGKILL the kernel: its GPUs must be free in Ray and in the broker within FREE_WITHIN_S."""
    killed_at = k.kill()
    wait_for(lambda: gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S,
             message=f"GPUs free in Ray and the broker after {what}'s SIGKILL")
    assert time.monotonic() - killed_at < FREE_WITHIN_S


def test_a_call_returns_its_value_streams_output_and_reports_moves_100_mb_each_way_and_imports_no_ray(
        kernel, broker, admin):
    k = kernel("""
        import numpy as np

        @gs.distributed(gpus=2)
        def double(big, factor):
            ctx = gs.context()
            print("hello from", ctx.rank, flush=True)
            gs.report(step=1, loss=0.5)
            gs.report(step=2, loss=0.25)
            return {"world": ctx.world_size, "big": big * factor}

        big = np.arange(100 * 2**20 // 8, dtype=np.float64)
        value = double(big, 2.0)
        info = double.last_run
        value["big"][0] = 7.0  # the result is the kernel's own, writable
        say(world=value["world"], same=bool(np.array_equal(value["big"][1:], big[1:] * 2)),
            ray="ray" in sys.modules, events=sorted(set(EVENTS)), history=info.history,
            lease_id=info.lease_id, released=info.released, end=info.end_reason, shipped=info.shipped_bytes,
            returned=info.returned_bytes, order=[e for e in EVENTS if e != "output"], receipt=info.receipt())
    """)
    got = k.result()
    assert got["world"] == 2 and got["same"], got
    assert got["ray"] is False, "the kernel imported ray"
    assert {"requesting", "granted", "running", "output", "report", "released", "finished"} <= set(got["events"])
    assert got["order"][0] == "requesting" and got["order"][-2:] == ["released", "finished"], got["order"]
    assert [r["step"] for r in got["history"]] == [1, 2] and got["history"][1]["loss"] == 0.25
    assert got["lease_id"] is not None and got["released"] and got["end"] == "finished"
    assert got["shipped"] >= 100 * 2**20 and got["returned"] >= 100 * 2**20
    assert "shipped 105 MB in" in got["receipt"] and "returned 105 MB in" in got["receipt"], got["receipt"]
    assert any("hello from 0" in line for line in k.lines) and any("hello from 1" in line for line in k.lines)
    rows = {row["lease_id"]: row for row in client.call(broker.leases, admin, True)}
    assert rows[got["lease_id"]]["state"] == "ended"


def test_a_user_exception_keeps_its_type_message_and_traceback(any_kernel):
    k = any_kernel("""
        @gs.distributed(gpus=2)
        def broken():
            raise ValueError("no good value: 42")

        try:
            broken()
        except gs.WorkerFailed as exc:
            say(type=type(exc).__name__, remote=exc.remote_type, message=exc.remote_message, text=str(exc),
                end=broken.last_run.end_reason, ray="ray" in sys.modules)
    """)
    got = k.result()
    assert got["type"] == "WorkerFailed" and got["remote"] == "ValueError", got
    assert got["message"] == "no good value: 42" and "in broken" in got["text"], got["text"]
    assert got["end"] == "failed" and got["ray"] is False


def test_stop_mid_run_ends_it_as_interrupted_and_releases_its_lease(kernel, broker, admin):
    k = kernel("""
        import time
        STOP_ON.append("SPINNING")

        @gs.distributed(gpus=2)
        def spin():
            print("SPINNING", flush=True)
            while True:
                time.sleep(0.05)

        try:
            spin()
        except KeyboardInterrupt as exc:
            say(raised=type(exc).__name__, end=spin.last_run.end_reason, lease_id=spin.last_run.lease_id,
                released=spin.last_run.released)
    """)
    got = k.result()
    assert got["raised"] == "KeyboardInterrupt" and got["end"] == "interrupted" and got["released"], got
    wait_for(lambda: gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S, message="GPUs free after the stop")
    row = next(r for r in client.call(broker.leases, admin, True) if r["lease_id"] == got["lease_id"])
    assert row["state"] == "ended", row


def test_killing_the_kernel_mid_run_frees_its_gpus_within_5_s(any_kernel, broker, admin):
    k = any_kernel("""
        import time

        @gs.distributed(gpus=2)
        def forever():
            print("RUNNING", flush=True)
            while True:
                time.sleep(0.5)

        forever()
    """)
    k.wait_for_line("[rank 0] RUNNING")
    assert free_gpus() == CLUSTER_GPUS - 2
    kill_and_see_gpus_freed(k, broker, admin, what="the kernel")


def test_a_background_run_leaves_a_checkpoint_the_kernel_reads_resume_continues_from_and_cancel_stops(kernel):
    k = kernel("""
        import time

        @gs.distributed(gpus=2)
        def count(until):
            state = gs.load_checkpoint() or {"n": 0, "runs": 0}
            state = {"n": state["n"], "runs": state["runs"] + 1}
            while state["n"] < until:
                state["n"] += 1
                gs.report(step=state["n"])
                gs.save_checkpoint(state)
            return state

        @gs.distributed(gpus=2)
        def spin():
            import time
            print("SPINNING", flush=True)
            while True:
                time.sleep(0.05)

        run = count.submit(3)
        first = run.result(timeout=120)
        saved = count.last_run.checkpoint
        resumed = count.resume(5)
        spinning = spin.submit()
        while spinning.state.value != "running":
            time.sleep(0.02)
        spinning.cancel()
        cancelled = type(spinning.exception(timeout=60)).__name__
        say(first=first, saved=saved, resumed=resumed, status=run.state.value, ray="ray" in sys.modules,
            cancelled=cancelled, cancelled_state=spinning.state.value, cancelled_end=spin.last_run.end_reason,
            cancelled_released=spin.last_run.released)
    """)
    got = k.result()
    assert got["first"] == {"n": 3, "runs": 1} and got["saved"] == {"n": 3, "runs": 1}, got
    assert got["resumed"] == {"n": 5, "runs": 2} and got["status"] == "finished", got
    assert (got["cancelled"], got["cancelled_state"], got["cancelled_end"]) == ("RunCancelled", "cancelled", "cancelled")
    assert got["cancelled_released"] and got["ray"] is False, got


@pytest.fixture
def other_account():
    """A real Unix account made for this test (a unique name), removed on every path."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("making a Unix account needs root and useradd")
    name = f"gsrun{uuid.uuid4().hex[:8]}"
    try:
        yield add_account(name, system=False, shell="/usr/sbin/nologin")
    finally:
        remove_accounts([name])


def test_a_kernel_of_another_account_runs_as_that_account_at_the_broker(kernel, other_account, broker, admin):
    k = kernel("""
        import getpass, os

        @gs.distributed(gpus=2)
        def where():
            return gs.context().world_size

        say(world=where(), me=getpass.getuser(), uid=os.getuid(), lease_id=where.last_run.lease_id,
            ray="ray" in sys.modules)
    """, account=other_account)
    got = k.result()
    assert got["world"] == 2 and got["me"] == other_account.pw_name and got["uid"] == other_account.pw_uid, got
    assert got["ray"] is False
    row = next(r for r in client.call(broker.leases, admin, True) if r["lease_id"] == got["lease_id"])
    assert row["user"] == other_account.pw_name, row


def test_a_sweep_runs_its_trials_through_the_gateway_prunes_and_finds_the_best(kernel):
    k = kernel("""
        import time

        def quadratic(x):
            for step in range(8):
                time.sleep(0.05)
                gs.report(step=step, val_loss=(x - 0.3) ** 2 + 0.2 / (step + 1))
            return {"x": x}

        result = gs.sweep(quadratic, {"x": gs.uniform(0.0, 1.0)}, trials=6, parallel=2, objective="val_loss",
                          mode="min", sampler="random", seed=3, pruner="asha", gpus=1)
        states = sorted({t.state.value for t in result.trials})
        say(states=states, count=len(result.trials), best=result.best.result, x=result.best.params["x"],
            ray="ray" in sys.modules)
    """)
    got = k.result(timeout=180)
    assert got["count"] == 6 and set(got["states"]) <= {"complete", "pruned"} and "complete" in got["states"], got
    assert got["best"] == {"x": got["x"]} and got["ray"] is False, got


def _forever():
    import time as clock

    print("RUNNING", flush=True)
    while True:
        clock.sleep(0.5)


def test_a_malformed_message_mid_run_ends_the_connection_and_frees_the_gpus(gateway, broker, admin):
    from gpusession.gateway.client import connect
    from gpusession.gateway.remote import pickle_call
    from gpusession.gateway.runwire import options_to_json
    from gpusession.run.caller.options import validate_run_options

    header, buffers = pickle_call(_forever, (), {})
    conn, welcome = connect("run", gateway)
    try:
        conn.send("run", [header, *buffers], name="forever", cwd=str(ROOT), buffers=len(buffers),
                  options=options_to_json(validate_run_options(gpus=2)), checkpoint=None, checkpoint_step=None,
                  asking={})
        while True:  # events until the ranks run
            message = conn.receive()
            assert message.kind == "event", message
            if message.get("event") == "output" and "RUNNING" in message.get("text", ""):
                break
        assert free_gpus() == CLUSTER_GPUS - 2
        conn.sock.sendall(b"\x00\x00\x00\x00\x00\x00\x00\x05hello")  # a frame that is not JSON
        sent_at = time.monotonic()
        wait_for(lambda: gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S,
                 message="GPUs free after a malformed message")
        assert time.monotonic() - sent_at < FREE_WITHIN_S
    finally:
        conn.close()


def test_a_gpu_cell_and_a_background_cell_run_through_the_gateway(any_kernel):
    k = any_kernel("""
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        for setup in ("%load_ext gpusession", "import gpusession as gs", "base = 10"):
            shell.run_cell(setup).raise_error()
        run = shell.run_cell("%%gpu 2\\nrank = gs.context().rank\\nworld = gs.context().world_size\\nbase + world")
        run.raise_error()
        ns = shell.user_ns
        first = (run.result, ns["rank"], ns["world"], ns["_gpu"].end_reason, ns["_gpu"].released)
        shell.run_cell("%%gpu 2 --bg\\nlater = gs.context().world_size * 100\\nlater + 1").raise_error()
        pulled = ns["_run"].pull(timeout=120)
        say(first=first, pulled=pulled, later=ns.get("later"), bg_end=ns["_gpu"].end_reason, ray="ray" in sys.modules)
    """)
    got = k.result()
    assert got["first"] == [12, 0, 2, "finished", True], got
    assert (got["pulled"], got["later"], got["bg_end"]) == (201, 200, "finished"), got
    assert got["ray"] is False, "the kernel imported ray"


def test_a_call_and_a_result_with_more_arrays_than_one_message_carries_round_trip(kernel):
    k = kernel("""
        import numpy as np

        @gs.distributed(gpus=1)
        def plus_one(arrays):
            return [a + 1 for a in arrays]

        arrays = [np.full(2**17 + 1, i, dtype=np.float64) for i in range(80)]  # 80 arrays of 1 MB
        back = plus_one(arrays)
        say(right=all(np.array_equal(b, a + 1) for a, b in zip(arrays, back)), count=len(back),
            shipped=plus_one.last_run.shipped_bytes)
    """)
    got = k.result()
    assert got["right"] and got["count"] == 80 and got["shipped"] >= 80 * 2**20, got


def test_a_call_over_its_accounts_bytes_in_the_gateway_is_refused_unleased_and_the_next_call_runs(
        kernel, broker, admin):
    from .conftest import CALL_BYTES

    k = kernel(f"""
        import numpy as np

        @gs.distributed(gpus=2)
        def size(x):
            return x.nbytes

        try:
            size(np.zeros({CALL_BYTES + 2**20} // 8))
            refused = None
        except gs.QuotaExceeded as exc:
            refused = str(exc)
        before = list(EVENTS)
        leased = size.last_run.lease_id if size.last_run is not None else None
        under = size(np.zeros({CALL_BYTES - 2**20} // 8))  # the refused call's bytes were given back
        say(refused=refused, before=before, leased=leased, under=under, end=size.last_run.end_reason)
    """)
    got = k.result()
    assert got["refused"] is not None, got
    assert "257.0 MiB" in got["refused"] and "256.0 MiB" in got["refused"], got["refused"]
    assert "--call-bytes-per-user" in got["refused"] and "Nothing was leased" in got["refused"], got["refused"]
    assert "granted" not in got["before"] and got["leased"] is None, got
    assert got["under"] == CALL_BYTES - 2**20 and got["end"] == "finished", got
    wait_for(lambda: gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S, message="every GPU free")


def test_killing_a_kernel_whose_call_waits_in_the_queue_drops_its_request_within_5_s(kernel, broker, admin):
    import gpusession as gs

    with gs.lease(gpus=CLUSTER_GPUS):
        k = kernel("""
            print("ASKING", flush=True)

            @gs.distributed(gpus=2)
            def never():
                return 1

            never()
        """)
        k.wait_for_line("ASKING")
        wait_for(lambda: any(r["state"] == "queued" for r in client.call(broker.leases, admin)), timeout=60,
                 message="the kernel's request queued")
        killed_at = k.kill()
        wait_for(lambda: not any(r["state"] == "queued" for r in client.call(broker.leases, admin)),
                 timeout=FREE_WITHIN_S, message="the dead kernel's queued request dropped")
        assert time.monotonic() - killed_at < FREE_WITHIN_S
