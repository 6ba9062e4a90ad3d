"""Stopping `gpusession hub` (Ctrl-C) with a user's run in flight: the service closes every lease
first, the user's GPUs are free in Ray within 5 s of the signal, and no process of the hub or its
accounts is left. A module of its own, so its hub is its own: it stops it, and no other test then
depends on running before it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_hub import _ready, _wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


LONG_CELL = """%%gpu 2
import time
for step in range(600):
    gs.report(step=step)
    time.sleep(0.5)"""


FREED_WITHIN_S = 5.0  # issue 19: a stopped hub's users' GPUs are free in Ray within 5 s


def test_stopping_the_hub_mid_run_frees_the_gpus_within_5_s_and_leaves_no_process(hub):
    """It stops this module's hub."""
    import sqlite3
    import time
    from concurrent.futures import ThreadPoolExecutor as Pool

    from .conftest import logged_at, stop_hub

    _ready(hub.admin, hub.bob)
    pool = Pool(1)
    pool.submit(hub.bob.run, LONG_CELL, 120)
    held = _wait_for(lambda: [l for l in hub.admin.api("GET", "gpusession/api/leases").json()
                              if l["user"] == hub.bob.name and l["state"] in ("granted", "placed")])
    assert held, "bob's run never got its GPUs"
    known = hub.descendants()  # JupyterHub, its proxy, the service, the users' servers and kernels
    assert len(known) >= 4, known
    signalled_at = time.time()
    stop_hub(hub.proc)
    pool.shutdown(wait=False)
    assert hub.proc.returncode == 0, hub.output.read_text()[-2000:]
    with sqlite3.connect(hub.layout.db_path) as db:
        state = db.execute("SELECT state, end_reason FROM leases WHERE id = ?", (held[0]["lease_id"],)).fetchone()
    assert state[0] == "ended", state
    service_log = (hub.layout.hub_dir / "service.log").read_text()
    freed = [line for line in service_log.splitlines() if "Ray shows 4 of 4 GPUs free" in line]
    assert freed, service_log[-2000:]
    freed_s = logged_at(freed[0]) - signalled_at
    assert freed_s <= FREED_WITHIN_S, (
        f"bob's GPUs were free in Ray {freed_s:.1f} s after the stop signal; the bound is {FREED_WITHIN_S} s "
        "from the signal (the log's time, millisecond resolution, is the margin)")
    alive = [proc for proc in known if proc.is_running() and proc.status() != "zombie"]
    assert alive == [], f"processes the hub started, still running: {alive}"
    assert hub.processes() == [], f"processes of the hub's accounts still running: {hub.processes()}"
    launcher = re.search(r"the launcher runs \(pid (\d+)\)", hub.output.read_text())
    assert launcher, hub.output.read_text()[-2000:]
    left = [str(path) for path in Path("/sys/fs/cgroup").glob(f"*/gpusession-launcher-{launcher.group(1)}")]
    assert left == [], f"the launcher's cgroups outlived it: {left}"
