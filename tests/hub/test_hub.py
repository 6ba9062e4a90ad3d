"""`gpusession hub` with real accounts: each user's server and kernels run as that Unix user,
their `%%gpu` cells run on the one cluster the service account runs, and the broker knows who is
who from the Hub's signature, not from what a kernel claims."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

SETUP = "%load_ext gpusession\nimport torch, getpass, gpusession as gs\nprint(getpass.getuser())"
GPU_CELL = """%%gpu 2
import getpass, torch.distributed as dist
total = torch.ones(1) * (gs.context().rank + 1)
dist.all_reduce(total)
rank_user = getpass.getuser()"""


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
        assert seen.stdout.split() == ["3.0", hub.layout.service_user], seen  # 1 + 2 over 2 ranks


ALICE_HOLDS = "held = gs.lease(gpus=1)\nheld.__enter__()\nprint(held.lease_id)"


def ledger(hub) -> tuple:
    """What an attempt could change, as the admin page reads it (usage grows by itself while
    alice holds GPUs, so GPU-hours are left out)."""
    leases = hub.admin.api("GET", "gpusession/api/leases?all=1").json()
    quotas = hub.admin.api("GET", "gpusession/api/quotas").json()
    return ([(l["lease_id"], l["user"], l["gpus"], l["state"], l["released_at"]) for l in leases],
            [(q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"], q["updated_at"]) for q in quotas])


ATTEMPTS = {
    "release": "client.call(b.release, {lease}, 'user', auth=client.lease_auth())",
    "claim": "client.call(b.status, {{'user': {alice!r}, 'signature': None, 'job_id': None}})",
    "claim_signed_as_self": "client.call(b.status, {{**client.lease_auth(), 'user': {alice!r}}})",
    "read_usage": "client.call(b.quota, {alice!r}, client.lease_auth())",
    "set_quota": "client.call(b.set_quota, {bob!r}, {{'max_gpus': 4}}, client.lease_auth())",
    "admin_token": "open({token_path!r}).read()",
    "identity_key": "open({key_path!r}).read()",
}


def test_bob_cannot_act_as_alice_or_admin_and_nothing_changes(hub):
    for user in (hub.admin, hub.alice, hub.bob):
        if user.kernel_id is None:
            user.start_server()
            assert user.run(SETUP).error is None
    lease = hub.alice.run(ALICE_HOLDS)
    assert lease.error is None, lease
    before = ledger(hub)
    assert any(row[1] == hub.alice.name for row in before[0]), before
    assert hub.bob.run("from gpusession.broker import client\nb = client.broker()").error is None
    names = {"alice": hub.alice.name, "bob": hub.bob.name, "lease": int(lease.stdout.strip()),
             "token_path": str(hub.layout.admin_token_path), "key_path": str(hub.layout.identity_key_path)}
    for attempt, code in ATTEMPTS.items():
        refused = hub.bob.run(code.format(**names))
        expected = "PermissionError" if attempt in ("admin_token", "identity_key") else "NotAuthorized"
        assert refused.error and refused.error.startswith(expected), f"{attempt}: {refused}"
    assert ledger(hub) == before  # the ledger and the quotas as they were
    assert hub.alice.run("held.__exit__(None, None, None)").error is None


def test_the_admin_page_opens_for_admins_only_and_shows_every_user(hub):
    for user in (hub.admin, hub.alice, hub.bob):
        if user.kernel_id is None:
            user.start_server()
            assert user.run(SETUP).error is None
    assert hub.alice.run("mine = gs.lease(gpus=1)\nmine.__enter__()").error is None
    assert hub.bob.run("mine = gs.lease(gpus=1)\nmine.__enter__()").error is None
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
        for user in (hub.alice, hub.bob):
            user.run("mine.__exit__(None, None, None)")


def test_a_quota_set_on_the_admin_page_holds_bob_back_until_raised(hub):
    """SPEC: asking for more than max_gpus is Infeasible at once; a request within the ceiling that
    would take the user's leases past it waits for quota. So bob holds 1 GPU, the admin sets his
    max_gpus to 2, and his `%%gpu 2` (1 + 2 > 2) waits until the admin raises it to 3."""
    for user in (hub.admin, hub.bob):
        if user.kernel_id is None:
            user.start_server()
            assert user.run(SETUP).error is None
    quota = f"gpusession/api/quotas/{hub.bob.name}"
    assert hub.admin.api("PUT", quota, json={"max_gpus": 2}).status_code == 200
    assert hub.bob.run("mine = gs.lease(gpus=1)\nmine.__enter__()").error is None
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(hub.bob.run, GPU_CELL)
            waiting = _wait_for(lambda: [l for l in hub.admin.api("GET", "gpusession/api/leases").json()
                                         if l["user"] == hub.bob.name and l["state"] == "queued"])
            assert waiting and "quota" in (waiting[0]["reason"] or ""), waiting
            assert hub.admin.api("PUT", quota, json={"max_gpus": 3}).status_code == 200
            ran = running.result(timeout=300)
        assert ran.error is None, ran
        shown = " ".join(str(data.get("text/plain", "")) + str(data.get("text/html", "")) for data in ran.outputs)
        assert "waiting for quota" in shown
    finally:
        hub.bob.run("mine.__exit__(None, None, None)")
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


LONG_CELL = """%%gpu 2
import time
for step in range(600):
    gs.report(step=step)
    time.sleep(0.5)"""


def test_stopping_the_hub_mid_run_closes_the_lease_and_leaves_no_process(hub):
    """Last in this module: it stops the module's hub."""
    import sqlite3
    import time
    from concurrent.futures import ThreadPoolExecutor as Pool

    from .conftest import stop_hub

    for user in (hub.admin, hub.bob):
        if user.kernel_id is None:
            user.start_server()
            assert user.run(SETUP).error is None
    pool = Pool(1)
    pool.submit(hub.bob.run, LONG_CELL, 120)
    held = _wait_for(lambda: [l for l in hub.admin.api("GET", "gpusession/api/leases").json()
                              if l["user"] == hub.bob.name and l["state"] in ("granted", "placed")])
    assert held, "bob's run never got its GPUs"
    stopping = time.monotonic()
    stop_hub(hub.proc)
    stopped_s = time.monotonic() - stopping
    pool.shutdown(wait=False)
    assert hub.proc.returncode == 0, hub.output.read_text()[-2000:]
    with sqlite3.connect(hub.layout.db_path) as db:
        state = db.execute("SELECT state, end_reason FROM leases WHERE id = ?", (held[0]["lease_id"],)).fetchone()
    assert state[0] == "ended", state
    service_log = (hub.layout.hub_dir / "service.log").read_text()
    assert "Ray shows 4 of 4 GPUs free" in service_log, service_log[-2000:]
    assert hub.processes() == [], f"left running after {stopped_s:.0f} s: {hub.processes()}"
