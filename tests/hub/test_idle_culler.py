"""The hub's idle culler (issue 32) with a 20 s timeout: it stops a server whose kernels have no
live run, and leaves alone past the timeout a server with a live background cell and one whose
only sign of life is a run of a script its kernel started (no output at all: what keeps that one
is the server asking the gateway for live runs). A detached run outlives its culled server and
its restarted kernel, and a new kernel of the same user attaches to its value.

One window of time serves the first four tests (the hub tests are slow, and every wait here is
the culler's): the three servers are set going at once and watched together (`window`).
Its hub has options of its own (HUB_ARGS); the file's name puts it after test_hub_stop in file
order, so the hub test_hub, test_hub_gateway and test_hub_stop share is stopped before this one
starts (two idle-or-busy hubs at once would slow the culler's timing on a 2-core machine)."""
from __future__ import annotations

import pwd
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpusession.hub.plan import Culling

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

IDLE_AFTER_S = 20  # short, as every wait here is the culler's; --cull-idle-after allows 10 s and more
HUB_ARGS = ["--cull-idle-after", str(IDLE_AFTER_S)]
CULLER = Culling(idle_after_s=IDLE_AFTER_S)  # what the hub derives from it: the culler looks every 3 s, servers
# report every 3 s. A server last active at t is culled after t + 20 s, once the culler looks after its
# report; the slack is a loaded machine's (the Hub stopping a server, a late report)
CULLED_WITHIN_S = IDLE_AFTER_S + CULLER.every_s + CULLER.report_every_s + 45
KEPT_FOR_S = IDLE_AFTER_S + CULLER.every_s + CULLER.report_every_s + 10  # past the timeout and every delay in
# reaching the Hub's record
SETUP = "%load_ext gpusession\nimport os, time, gpusession as gs"


def _loop_until(stop: str, marker: str) -> str:
    """A rank's loop: mark that it runs, then wait for the user's stop file (at most 5 min)."""
    return (f"import os, time\nopen(os.path.expanduser({marker!r}), 'w').close()\n"
            f"stop = os.path.expanduser({stop!r})\ndeadline = time.monotonic() + 300\n"
            "while not os.path.exists(stop) and time.monotonic() < deadline:\n    time.sleep(0.2)\n"
            "stopped = os.path.exists(stop)")


DETACHED_CELL = ("%%gpu 1 --bg --detach --max-duration 10m -o {name}\n" + _loop_until("~/{stop}", "~/{stop}.running")
                 + "\nanswer = 6 * 7 * gs.context().world_size\nanswer + 1")
BACKGROUND_CELL = "%%gpu 1 --bg -o bg\n" + _loop_until("~/bg.stop", "~/bg.running")
SCRIPT = '''import json, os, gpusession as gs

@gs.distributed(gpus=1)
def train():
''' + "\n".join("    " + line for line in _loop_until("~/script.stop", "~/script.running").splitlines()) + '''
    return stopped

with open(os.path.expanduser("~/script.result"), "w") as out:
    json.dump(train(), out)
'''
START_SCRIPT = (f"import subprocess, sys\nscript = subprocess.Popen([sys.executable, '-c', {SCRIPT!r}], "
                "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
                "                          stderr=open(os.path.expanduser('~/script.err'), 'w'))")


def _home(user) -> Path:
    return Path(pwd.getpwnam(user.name).pw_dir)


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def _fresh_kernel(user) -> None:
    """The user's server (started again if the culler stopped it) and a new kernel with gpusession."""
    user.start_server()
    user.kernel_id = None
    ran = user.run(SETUP)
    assert ran.error is None, f"{user.name}: {ran}"


def _started_detached(user, name: str, stop: str) -> str:
    """A detached cell of `user`, running on its GPU; its run id."""
    ran = user.run(DETACHED_CELL.format(name=name, stop=stop))
    assert ran.error is None, ran
    run_id = user.run(f"print({name}.run_id)").stdout.strip()
    _wait_for(lambda: (_home(user) / f"{stop}.running").exists(), 180, f"{user.name}'s detached run to start")
    return run_id


@dataclass
class Window:
    idle_since: float  # the last request to the admin's server (its kernel shut down, a detached run going)
    culled_after_s: float | None  # when the Hub no longer listed it, from idle_since
    runs_since: float  # the last request to alice's and bob's servers (their runs going)
    gone: dict  # user name -> seconds after runs_since their server was found stopped
    detached_run: str
    culler_log: str
    alice_kernel: str  # the kernels whose runs go on until the tests stop them
    bob_kernel: str


@pytest.fixture(scope="module")
def window(hub):
    """The admin starts a detached run and shuts its kernel down; alice leaves a background cell
    running; bob's kernel starts a script whose run prints nothing. Then nobody touches any of
    the three servers: the admin's is watched until the Hub no longer lists it, alice's and bob's
    for KEPT_FOR_S. Their runs are stopped afterwards by the tests, by their users."""
    for user, cell in ((hub.alice, BACKGROUND_CELL), (hub.bob, START_SCRIPT)):  # each at once: 20 s go fast
        _fresh_kernel(user)
        assert user.run(cell).error is None
    _wait_for(lambda: (_home(hub.alice) / "bg.running").exists(), 180, "alice's background run to start")
    _wait_for(lambda: (_home(hub.bob) / "script.running").exists(), 180,
              f"bob's script's run to start ({_home(hub.bob) / 'script.err'})")
    runs_since = time.monotonic()
    _fresh_kernel(hub.admin)
    detached = _started_detached(hub.admin, "first", "detached.stop")
    hub.admin.shut_down_kernel()  # the run is detached: it goes on, followed by no kernel
    idle_since = time.monotonic()
    gone: dict = {}
    culled_after = None
    while time.monotonic() < max(idle_since + CULLED_WITHIN_S if culled_after is None else 0,
                                 runs_since + KEPT_FOR_S):
        if culled_after is None and hub.admin.server_stopped():
            culled_after = time.monotonic() - idle_since
        for user in (hub.alice, hub.bob):
            if user.name not in gone and not user.server_running():
                gone[user.name] = time.monotonic() - runs_since
        time.sleep(1)
    log = (hub.layout.hub_dir / "jupyterhub.log").read_text(errors="replace")
    return Window(idle_since, culled_after, runs_since, gone, detached, log, hub.alice.kernel_id, hub.bob.kernel_id)


def test_the_culler_stops_a_server_whose_kernels_have_no_live_run_after_the_timeout(hub, window):
    assert window.culled_after_s is not None, (
        f"the admin's server (no kernel, only a detached run) was still running {CULLED_WITHIN_S} s after its "
        f"last request; the Hub's log:\n{window.culler_log[-3000:]}")
    assert IDLE_AFTER_S - 1 <= window.culled_after_s <= CULLED_WITHIN_S, window.culled_after_s
    assert re.search(rf"Culling server {hub.admin.name} \(inactive for 00:0\d:\d\d\)", window.culler_log), \
        window.culler_log[-3000:]


def test_the_culler_leaves_a_server_with_a_live_background_cell_alone_past_the_timeout(hub, window):
    assert hub.alice.name not in window.gone, f"alice's server was culled {window.gone} s into her run"
    assert hub.alice.server_running()
    hub.alice.kernel_id = window.alice_kernel
    pulled = hub.alice.run("open(os.path.expanduser('~/bg.stop'), 'w').close()\nbg.pull(timeout=120)\nprint(stopped)")
    assert (pulled.error, pulled.stdout.split()[-1:]) == (None, ["True"]), pulled


def test_a_silent_run_of_a_script_under_the_server_keeps_it_alone_past_the_timeout(hub, window):
    """No output, no request, no kernel message: only the server's question to the gateway says
    that a process under it follows a live run."""
    assert hub.bob.name not in window.gone, f"bob's server was culled {window.gone} s into his script's run"
    hub.bob.kernel_id = window.bob_kernel
    ran = hub.bob.run("open(os.path.expanduser('~/script.stop'), 'w').close()\nprint(script.wait(timeout=120), "
                      "open(os.path.expanduser('~/script.result')).read())")
    assert (ran.error, ran.stdout.split()) == (None, ["0", "true"]), ran


def test_a_detached_run_outlives_its_culled_server_and_a_new_servers_kernel_attaches_to_its_value(hub, window):
    assert window.culled_after_s is not None, "the admin's server was not culled"
    _fresh_kernel(hub.admin)  # a new server: the culler stopped the first
    ran = hub.admin.run(f"open(os.path.expanduser('~/detached.stop'), 'w').close()\n"
                        f"%gpu attach {window.detached_run} -o again\nprint(again.pull(timeout=120), answer, stopped)\n"
                        f"print([r.state for r in gs.runs(all=True) if r.run_id == {window.detached_run!r}])")
    assert ran.error is None, ran
    assert ran.stdout.splitlines()[-2:] == ["43 42 True", "['finished']"], ran.stdout


def test_a_detached_run_outlives_a_kernel_restart_and_the_restarted_kernel_attaches_to_its_value(hub):
    _fresh_kernel(hub.alice)
    run_id = _started_detached(hub.alice, "before", "restart.stop")
    hub.alice.restart_kernel()
    ran = hub.alice.run(f"{SETUP}\nprint('names', 'before' in globals())\n"
                        "open(os.path.expanduser('~/restart.stop'), 'w').close()\n"
                        f"%gpu attach {run_id} -o after\nprint(after.pull(timeout=120), answer, stopped)")
    assert ran.error is None, ran
    assert ran.stdout.splitlines()[0] == "names False", ran.stdout  # a restarted kernel: nothing of before
    assert ran.stdout.splitlines()[-1] == "43 42 True", ran.stdout
