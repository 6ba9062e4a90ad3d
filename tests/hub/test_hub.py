"""`gpusession hub` with real accounts: each user's server and kernels run as that Unix user,
their `%%gpu` cells run on the one cluster the service account runs, and the broker knows who is
who from the Hub's signature, not from what a kernel claims."""
from __future__ import annotations

import json
import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from gpusession.broker.policy.states import LeaseState

from ..conftest import ROOT

# the module's hub starts within its first test (minutes on a loaded machine), and a user's first
# JupyterLab page loads the whole app
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
# the admin's policy for detached runs (the sidebar test reads it back): a limit for runs naming
# none, and how long an ended one is kept
HUB_ARGS = ["--detach-max-duration", "10m", "--detach-retention", "2d"]

SETUP = "%load_ext gpusession\nimport torch, getpass, gpusession as gs\nprint(getpass.getuser())"
GPU_CELL = """%%gpu 2
import getpass, torch.distributed as dist
total = torch.ones(1) * (gs.context().rank + 1)
dist.all_reduce(total)
rank_user = getpass.getuser()"""


def _ready(*users) -> None:
    """Each user's server started and a kernel with gpusession loaded (once per user per module)."""
    for user in users:
        if user.kernel_id is None:
            user.start_server()
            setup = user.run(SETUP)
            assert setup.error is None, f"{user.name}: {setup}"


def test_each_user_runs_a_gpu_cell_at_once_on_the_shared_cluster(hub):
    for user in (hub.alice, hub.bob):
        user.start_server()
        setup = user.run(SETUP)
        assert setup.error is None, setup
        assert setup.stdout.strip() == user.name  # the kernel runs as the user's own Unix account
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda user: user.run(GPU_CELL), (hub.alice, hub.bob)))
    for user, ran in zip((hub.alice, hub.bob), runs):
        assert ran.error is None, f"{user.name}: {ran}"
        seen = user.run("print(total.item(), rank_user)")
        assert seen.stdout.split() == ["3.0", user.name], seen  # 1 + 2 over 2 ranks, run as the user


MY_FILE = "import os\npath = os.path.expanduser('~/mine.txt')\nopen(path, 'w').write('42')\nos.chmod(path, 0o600)"
RANK_IS_ITS_USER = """%%gpu 2
import os
seen = open(path).read()
where = gs.context().scratch_dir
made = os.path.expanduser(f"~/from-rank-{gs.context().rank}.txt")
open(made, "w").write("x")
facts = (seen, os.stat(where).st_uid, oct(os.stat(where).st_mode & 0o777), os.stat(made).st_uid, os.getcwd())"""


def test_a_rank_runs_as_its_user_reads_their_0600_file_and_what_it_writes_is_theirs(hub):
    """README "A team on one machine": the launcher starts each rank as the user whose kernel
    called it, in the notebook's folder, with a 0700 scratch directory of that user's."""
    _ready(hub.alice)
    assert hub.alice.run(MY_FILE).error is None
    ran = hub.alice.run(RANK_IS_ITS_USER)
    assert ran.error is None, ran
    shown = hub.alice.run("import os\nprint(repr(facts), os.getuid(), repr(os.getcwd()))").stdout.strip()
    facts, uid, cwd = shown.rsplit(" ", 2)
    assert eval(facts) == ("42", int(uid), "0o700", int(uid), eval(cwd)), shown


BIG_IN_AND_OUT = """%%gpu 2
doubled = big * 2  # rank 0's 8 MB result travels back through its node file too"""


def test_a_big_argument_and_result_go_through_the_services_own_0700_node_folder(hub):
    """audit41 F1: the node's copy of alice's 8 MB argument and her rank's 8 MB result lie in the
    service account's own folder in /dev/shm (0700, no other account's to make first or enter);
    her ranks get them by descriptor, and she gets her data whole."""
    import os
    import pwd
    import stat

    _ready(hub.alice)
    assert hub.alice.run("import numpy\nbig = numpy.arange(1 << 20, dtype=numpy.float64)").error is None
    ran = hub.alice.run(BIG_IN_AND_OUT)
    assert ran.error is None, ran
    shown = hub.alice.run("print(bool((doubled == big * 2).all()), doubled.nbytes)").stdout.split()
    assert shown == ["True", str(8 << 20)], shown
    service = pwd.getpwnam(hub.layout.service_user).pw_uid
    base = os.lstat(f"/dev/shm/gpusession-{service}")
    assert stat.S_ISDIR(base.st_mode) and base.st_uid == service and stat.S_IMODE(base.st_mode) == 0o700


ANN_WAITS = """%%gpu 1
import json, os, time
from pathlib import Path
note = Path({note!r})
note.write_text(json.dumps({{"pid": os.getpid(), "scratch": gs.context().scratch_dir,
                             "tmp": os.environ["TMPDIR"]}}))
note.chmod(0o644)
stop = Path({stop!r})
deadline = time.monotonic() + 240
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
ann_done = stop.exists()"""

BOB_ATTACKS = """%%gpu 1
import json, os, signal, socket, subprocess, sys
ann = json.loads(open({note!r}).read())
def attempt(act):
    try:
        act()
        return "done"
    except PermissionError:
        return "refused"
def connect_launcher():
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect({launcher!r})
tried = {{
    "environ": attempt(lambda: open(f"/proc/{{ann['pid']}}/environ").read()),
    "signal": attempt(lambda: os.kill(ann["pid"], signal.SIGTERM)),
    "scratch": attempt(lambda: os.listdir(ann["scratch"])),
    "tmp": attempt(lambda: os.listdir(ann["tmp"])),
    "admin_token": attempt(lambda: open({token!r}).read()),
    "identity_key": attempt(lambda: open({key!r}).read()),
    "launcher": attempt(connect_launcher),
}}
daemon = subprocess.Popen([sys.executable, "-c", "import os, sys, time\\nif os.fork(): os._exit(0)\\nos.setsid()\\n"
                           "print(os.getpid(), flush=True)\\ntime.sleep(600)"], stdout=subprocess.PIPE, text=True)
left_behind = int(daemon.stdout.readline())
daemon.wait()"""


def test_bobs_rank_cannot_touch_anns_rank_or_the_services_secrets_and_leaves_nothing_behind(hub):
    """Ann's rank runs while bob's rank attacks it: her /proc environ, a signal, her scratch and
    temporary directory, the broker's secrets, the launcher's socket; and bob's double-forked,
    setsid process is gone once his cell returns. Ann's run ends right."""
    import json
    import os
    import pwd

    import psutil

    from gpusession.hub.launching import launcher_dir
    from gpusession.launcher.__main__ import socket_path

    _ready(hub.alice, hub.bob)
    shared = hub.layout.state.parent / "shared"  # where ann's rank leaves her pid for the attacker
    shared.mkdir(mode=0o777, exist_ok=True)  # (removed with the module's hub)
    os.chmod(shared, 0o1777)
    note, stop = shared / "ann.json", shared / "stop"
    pool = ThreadPoolExecutor(1)
    ann_run = pool.submit(hub.alice.run, ANN_WAITS.format(note=str(note), stop=str(stop)), 300)
    try:
        assert _wait_for(lambda: note.exists() and note.read_text()), f"ann's rank never started: {ann_run}"
        ann = json.loads(note.read_text())
        attack = BOB_ATTACKS.format(note=str(note), token=str(hub.layout.admin_token_path),
                                    key=str(hub.layout.identity_key_path),
                                    launcher=str(socket_path(launcher_dir(hub.layout))))
        ran = hub.bob.run(attack)
        assert ran.error is None, ran
        shown = hub.bob.run("print(json.dumps(tried), left_behind)").stdout.strip().rsplit(" ", 1)
        assert json.loads(shown[0]) == {name: "refused" for name in (
            "environ", "signal", "scratch", "tmp", "admin_token", "identity_key", "launcher")}, shown
        left = int(shown[1])
        assert not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE, \
            f"bob's setsid process {left} outlived his cell"
        assert psutil.Process(ann["pid"]).uids().real == pwd.getpwnam(hub.alice.name).pw_uid  # untouched, hers
    finally:
        stop.touch()
        done = ann_run.result(timeout=300)
        pool.shutdown()
    assert done.error is None, done
    assert hub.alice.run("print(ann_done)").stdout.strip() == "True"


# Holding GPUs from a hub kernel: a background run (held leases, gs.lease(), are not offered
# through the gateway) whose rank waits until a file of its user's appears.
HOLD = """import os
@gs.distributed(gpus=1)
def hold(path):
    import os, time
    while not os.path.exists(path):
        time.sleep(0.1)
release_path = os.path.expanduser('~/release-hold')
if os.path.exists(release_path):
    os.unlink(release_path)
holding = hold.submit(release_path)"""
RELEASE = "open(release_path, 'w').close()\nholding.result()"


def held_lease(hub, user) -> dict | None:
    """The user's lease that holds GPUs now (granted, not released), as the admin page lists it."""
    rows = [l for l in hub.admin.api("GET", "gpusession/api/leases").json()
            if l["user"] == user.name and l["state"] != "queued" and not l.get("released_at")]
    return rows[0] if rows else None


def hold_one_gpu(hub, *users) -> None:
    """Each user's background run holds one GPU, its lease placed: a granted lease becomes placed
    once Ray placed its group, so a snapshot of the ledger taken while granted changes by itself."""
    for user in users:
        started = user.run(HOLD)
        assert started.error is None, f"{user.name}: {started}"
        assert _wait_for(lambda: (held_lease(hub, user) or {}).get("state") == LeaseState.PLACED), \
            f"{user.name}'s background run never held its GPU"


def release(*users) -> None:
    for user in users:
        ended = user.run(RELEASE)
        assert ended.error is None, f"{user.name}: {ended}"


def ledger(hub) -> tuple:
    """What an attempt could change, as the admin page reads it (usage grows by itself while
    alice holds GPUs, so GPU-hours are left out)."""
    leases = hub.admin.api("GET", "gpusession/api/leases?all=1").json()
    quotas = hub.admin.api("GET", "gpusession/api/quotas").json()
    return ([(l["lease_id"], l["user"], l["gpus"], l["state"], l["released_at"]) for l in leases],
            [(q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"], q["updated_at"]) for q in quotas])


# What bob's kernel can reach is the gateway: every attempt goes through it, by the method's name,
# as bob (the gateway reads his uid from the socket); and the secret files, as his own account.
ATTEMPTS = {
    "revoke_alices_lease": "brokerclient.call('revoke', lease_id={lease})",
    "claim_alices_name": "brokerclient.call('status', user={alice!r})",
    "read_alices_quota": "brokerclient.call('quota', user={alice!r})",
    "set_own_quota": "brokerclient.call('set_quota', user={bob!r}, update={{'max_gpus': 4}})",
    "admin_token": "open({token_path!r}).read()",
    "identity_key": "open({key_path!r}).read()",
}
EXPECTED = {"claim_alices_name": "InvalidRequest", "admin_token": "PermissionError", "identity_key": "PermissionError"}


def test_bob_cannot_act_as_alice_or_admin_and_nothing_changes(hub):
    _ready(hub.admin, hub.alice, hub.bob)
    hold_one_gpu(hub, hub.alice)
    before = ledger(hub)
    lease = held_lease(hub, hub.alice)["lease_id"]
    names = {"alice": hub.alice.name, "bob": hub.bob.name, "lease": int(lease),
             "token_path": str(hub.layout.admin_token_path), "key_path": str(hub.layout.identity_key_path)}
    assert hub.bob.run("from gpusession.gateway import brokerclient").error is None
    for attempt, code in ATTEMPTS.items():
        refused = hub.bob.run(code.format(**names))
        expected = EXPECTED.get(attempt, "NotAuthorized")
        assert refused.error and refused.error.startswith(expected), f"{attempt}: {refused}"
    assert ledger(hub) == before  # the ledger and the quotas as they were
    release(hub.alice)  # alice's run ends right


def test_the_admin_page_opens_for_admins_only_and_shows_every_user(hub):
    _ready(hub.admin, hub.alice, hub.bob)
    hold_one_gpu(hub, hub.alice, hub.bob)
    try:
        assert hub.admin.api("GET", "gpusession/admin").status_code == 200
        assert hub.bob.api("GET", "gpusession/admin").status_code == 403
        seen = {lease["user"] for lease in hub.admin.api("GET", "gpusession/api/leases").json()}
        assert {hub.alice.name, hub.bob.name} <= seen
        own = hub.bob.run("print([l['user'] for l in gs.status().leases])")
        assert own.stdout.strip() == repr([hub.bob.name])  # bob's status: his one lease, not alice's
        shown = hub.bob.run("%gpu status")
        assert shown.error is None and shown.stdout.count("  lease ") == 1, shown
    finally:
        release(hub.alice, hub.bob)


def test_a_quota_set_on_the_admin_page_holds_bob_back_until_raised(hub, browser):
    """SPEC: asking for more than max_gpus is Infeasible at once; a request within the ceiling that
    would take the user's leases past it waits for quota. So bob holds 1 GPU, the admin sets his
    max_gpus to 2 on the admin page (in chromium, through the Hub), and bob's `%%gpu 2` (1 + 2 > 2)
    waits, saying so in his cell, until the admin raises it to 3 on the same page."""
    _ready(hub.admin, hub.bob)
    quota = f"gpusession/api/quotas/{hub.bob.name}"
    admin = logged_in_page(browser, hub, hub.admin)
    try:
        admin.goto(f"{hub.url}/user/{hub.admin.name}/gpusession/admin")
        admin.fill("#gs-add-user", hub.bob.name)
        admin.fill("#gs-add-max-gpus", "2")
        admin.click("#gs-add")
        expect(admin.locator("#gs-banner")).to_contain_text(f"Saved the quota of {hub.bob.name}")
        assert hub.admin.api("GET", quota).json()["max_gpus"] == 2
        hold_one_gpu(hub, hub.bob)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(hub.bob.run, GPU_CELL)
            waiting = _wait_for(lambda: [l for l in hub.admin.api("GET", "gpusession/api/leases").json()
                                         if l["user"] == hub.bob.name and l["state"] == "queued"])
            assert waiting and "quota" in (waiting[0]["reason"] or ""), waiting
            row = admin.locator("#gs-quotas tbody tr").filter(has=admin.locator("span.user", has_text=hub.bob.name))
            row.get_by_label(f"max GPUs of {hub.bob.name}").fill("3")
            row.get_by_role("button", name="Save").click()
            expect(admin.locator("#gs-banner")).to_contain_text(f"Saved the quota of {hub.bob.name}")
            ran = running.result(timeout=300)
        assert ran.error is None, ran
        shown = " ".join(str(data.get("text/plain", "")) + str(data.get("text/html", "")) for data in ran.outputs)
        assert "waiting for quota" in shown, shown[-2000:]
    finally:
        admin.context.close()
        release(hub.bob)
        hub.admin.api("DELETE", quota)


def _wait_for(probe, timeout_s: float = 120.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    return None


LAB_NOTEBOOK = "two-at-once.ipynb"
LAB_CELLS = ["%load_ext gpusession\nimport torch, gpusession as gs",
             GPU_CELL + "\nimport time\ntime.sleep(3)  # long enough for the other user's run to overlap\n"
             "if gs.context().rank == 0:\n    print('sum', total.item(), 'as', rank_user, flush=True)"]
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"


def test_two_users_log_in_through_the_hub_page_and_run_gpu_2_cells_at_once_in_jupyterlab(hub, browser):
    pages = {user.name: lab_through_login(browser, hub, user) for user in (hub.alice, hub.bob)}
    for page in pages.values():
        run_in_lab(page, 0)
        lab_cell(page, 0).locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(timeout=120_000)
    for page in pages.values():  # both pressed before either is looked at: the runs overlap
        run_in_lab(page, 1)
    for name, page in pages.items():
        output = lab_cell(page, 1).locator(".jp-OutputArea-output", has_text="sum ")
        output.wait_for(timeout=300_000)
        assert f"sum 3.0 as {name}" in output.inner_text(), f"{name}: {output.inner_text()}"  # ranks run as their user
    with sqlite3.connect(hub.layout.db_path) as db:  # the ledger: when each run held its 2 GPUs
        runs = [db.execute("SELECT granted_at, released_at FROM leases WHERE user = ? AND gpus = 2 "
                           "ORDER BY granted_at DESC LIMIT 1", (user.name,)).fetchone() for user in (hub.alice, hub.bob)]
    runs = [{"granted_at": granted, "released_at": released} for granted, released in runs]
    assert max(r["granted_at"] for r in runs) < min(r["released_at"] or float("inf") for r in runs), (
        f"the two runs did not hold their 2 GPUs at the same time: {runs}")
    for page in pages.values():
        page.context.close()


def test_the_admin_page_through_the_hub_in_the_browser_opens_for_the_admin_only(hub, browser):
    _ready(hub.admin, hub.alice, hub.bob)
    hold_one_gpu(hub, hub.alice, hub.bob)
    try:
        admin = logged_in_page(browser, hub, hub.admin)
        shown = admin.goto(f"{hub.url}/user/{hub.admin.name}/gpusession/admin")
        assert shown.status == 200
        for name in (hub.alice.name, hub.bob.name):
            admin.get_by_text(name).first.wait_for(timeout=60_000)
        bob = logged_in_page(browser, hub, hub.bob)
        assert bob.goto(f"{hub.url}/user/{hub.bob.name}/gpusession/admin").status == 403
        for page in (admin, bob):
            page.context.close()
    finally:
        release(hub.alice, hub.bob)


def logged_in_page(browser, hub, user):
    """A fresh browser context logged in through the Hub's own login page."""
    context = browser.new_context(color_scheme="light", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user.name)
    page.fill("#password_input", user.password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/user/{user.name}/"), timeout=300_000)
    return page


def lab_through_login(browser, hub, user):
    """Log in on the Hub's page (it spawns the server), then open the notebook in JupyterLab."""
    page = logged_in_page(browser, hub, user)
    if user.token is None:
        user.start_server()  # the server runs already; this gives the test its API token
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "source": code, "metadata": {}, "outputs": [], "execution_count": None}
        for i, code in enumerate(LAB_CELLS)]}
    put = user.api("PUT", f"api/contents/{LAB_NOTEBOOK}", json={"type": "notebook", "format": "json", "content": notebook})
    assert put.status_code in (200, 201), put.text
    page.goto(f"{hub.url}/user/{user.name}/lab/tree/{LAB_NOTEBOOK}")
    lab_cell(page, len(LAB_CELLS) - 1).wait_for(timeout=120_000)
    deadline = time.monotonic() + 240
    while True:  # under load JupyterLab may ask "Select Kernel" before the session has its kernel
        accept_kernel_dialog(page)
        try:
            page.get_by_text(KERNEL_IDLE).wait_for(timeout=10_000)
            return page
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                page.screenshot(path=str(ROOT / "test-artifacts" / f"hub-{user.name}-no-kernel.png"))
                raise


def lab_cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def accept_kernel_dialog(page) -> None:
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count():
        dialog.locator(".jp-mod-accept").click()


def run_in_lab(page, index: int) -> None:
    """Shift+Enter on the cell, as a user does; answer JupyterLab's "Select Kernel" if it asks."""
    accept_kernel_dialog(page)
    lab_cell(page, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


DETACH_TWO = """@gs.distributed(gpus=1)
def quick():
    return 6 * 7

@gs.distributed(gpus=1)
def slow():
    import time
    while True:
        time.sleep(0.2)

done = quick.submit(detach=True)  # the hub's default limit: HUB_ARGS
assert done.result() == 42
going = slow.submit(detach=True, max_duration=300)
print(done.run_id, going.run_id)
print(sorted(r.max_duration for r in gs.runs(all=True) if r.run_id in (done.run_id, going.run_id)))"""


RUNS_COMMAND = """import json, subprocess, sys
done = subprocess.run([sys.executable, "-m", "gpusession.cli", "runs", *{args!r}], capture_output=True, text=True)
print(json.dumps([done.returncode, done.stdout, done.stderr]))"""


def runs_command(user, *args: str) -> tuple[int, str, str]:
    """`gpusession runs ARGS` as the user runs it in a terminal of their server: (status, out, err)."""
    ran = user.run(RUNS_COMMAND.format(args=list(args)))
    assert ran.error is None, ran
    return tuple(json.loads(ran.stdout.strip().splitlines()[-1]))


SPIN_DETACHED = """import time

@gs.distributed(gpus=1)
def spin():
    import time
    while True:
        time.sleep(0.2)

spinning = spin.submit(detach=True, max_duration=300)
deadline = time.monotonic() + 120
while spinning.state.value != "running" and not spinning.done() and time.monotonic() < deadline:
    time.sleep(0.05)
assert spinning.state.value == "running", spinning
print(spinning.run_id)"""


def test_the_hubs_admin_lists_every_accounts_detached_runs_in_a_shell_and_cancels_one_that_others_cannot_list(hub):
    _ready(hub.admin, hub.alice, hub.bob)
    started = hub.alice.run(SPIN_DETACHED)
    assert started.error is None, started
    run_id = started.stdout.strip()
    try:
        status, out, err = runs_command(hub.bob, "list", "--every-user")
        assert status == 1 and f"{hub.bob.name} is not one" in err, (status, out, err)  # a user, not an admin
        status, out, err = runs_command(hub.bob, "list")
        assert (status, out) == (0, "(none)\n"), err  # bob's own: none; alice's is not his to see
        status, out, err = runs_command(hub.admin, "list", "--every-user", "--json")
        assert status == 0, err
        row = next(r for r in json.loads(out) if r["run_id"] == run_id)
        assert (row["user"], row["name"], row["state"], row["gpus"]) == (hub.alice.name, "spin", "running", 1)
        status, out, err = runs_command(hub.admin, "cancel", run_id)
        assert status == 0 and out.startswith(f"detached run {run_id}: cancelling"), (status, out, err)
        assert _wait_for(lambda: held_lease(hub, hub.alice) is None, 30), "the cancelled run still holds its GPU"
        states = hub.alice.run("print([r.state for r in gs.runs(all=True) if r.run_id == spinning.run_id])")
        assert states.stdout.strip() == "['cancelled']", states
    finally:
        hub.alice.run("spinning.cancel()")


def test_the_lab_sidebar_lists_detached_runs_with_the_hubs_limit_and_retention_stops_one_and_attaches_another(
        hub, browser):
    _ready(hub.admin, hub.alice)  # the admin's server answers held_lease
    started = hub.alice.run(DETACH_TWO)
    assert started.error is None, started
    ids, limits = started.stdout.strip().splitlines()
    finished_id, live_id = ids.split()
    assert limits == "[300.0, 600.0]", started  # the named limit, and the admin's default for the other
    page = lab_through_login(browser, hub, hub.alice)
    try:
        tab = page.locator('.lm-TabBar-tab[data-id="gpusession-sidebar"]')
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        live = page.locator(f'#gpusession-sidebar li.gs-detached-run[data-run="{live_id}"]')
        finished = page.locator(f'#gpusession-sidebar li.gs-detached-run[data-run="{finished_id}"]')
        expect(live).to_contain_text("running", timeout=60_000)
        expect(live).to_contain_text("slow")
        expect(finished).to_contain_text("finished")
        expect(finished).to_contain_text("kept 2.0 days more")  # the admin's retention
        assert finished.locator("button.gs-stop").count() == 0  # an ended run offers attach only

        live.locator("button.gs-stop").click()
        expect(live).to_contain_text("cancelled", timeout=30_000)
        assert _wait_for(lambda: held_lease(hub, hub.alice) is None, 30), "the stopped run still holds its GPU"
        states = hub.alice.run("print(sorted((r.run_id, r.state) for r in gs.runs(all=True)))")
        assert f"('{live_id}', 'cancelled')" in states.stdout, states

        finished.locator("button.gs-attach").click()  # a new cell below the active one, run at once
        attached = page.locator(".jp-Notebook .jp-Cell", has_text=f'gs.attach("{finished_id}")')
        try:
            attached.wait_for(timeout=30_000)
        except PlaywrightTimeout:
            page.screenshot(path=str(ROOT / "test-artifacts" / "hub-sidebar-attach.png"))
            raise AssertionError("no attach cell; the sidebar said: "
                                 + page.locator("#gpusession-sidebar .gs-error").inner_text()) from None
        attached.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(timeout=120_000)
        attached.locator(".jp-InputPrompt").click()  # select it (command mode), then a cell below it
        page.keyboard.press("b")
        page.keyboard.press("Enter")
        page.keyboard.type(f"print('value', run_{finished_id[:8]}.result())")
        page.keyboard.press("Shift+Enter")
        asked = page.locator(".jp-Notebook .jp-Cell", has_text="print('value'")
        expect(asked.locator(".jp-OutputArea-output")).to_contain_text("value 42", timeout=60_000)
    finally:
        page.context.close()
