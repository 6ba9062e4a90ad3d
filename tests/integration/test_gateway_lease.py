"""Held leases through the gateway (issue 28): a kernel with GPUSESSION_GATEWAY and no Ray address
holds `gs.lease(gpus=2)`; the gateway holds the lease for the kernel's account while the kernel's
connection lives, runs each `lease.run` on it, and gives the GPUs back at release or when the
kernel dies. The gateway host of tests/integration/conftest.py."""
from __future__ import annotations

import json
import textwrap
import uuid

import pytest

import gpusession as gs
from gpusession.broker import client

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for
from .test_gateway_runs import kernel, other_account  # noqa: F401 - the fixtures
from .test_gateway_runs import FREE_WITHIN_S, gpus_free_everywhere, kill_and_see_gpus_freed

HOLD = """
import time

def where(x):
    ctx = gs.context()
    print("ran on rank", ctx.rank, flush=True)
    return {"lease": ctx.lease_id, "world": ctx.world_size, "double": 2 * x}

def forever():
    import time
    print("RUNNING", flush=True)
    while True:
        time.sleep(0.5)

lease = gs.lease(gpus=2)
print("HELD " + json.dumps({"lease_id": lease.lease_id, "gpus": lease.gpus, "repr": repr(lease)}), flush=True)
"""


def holding(body: str) -> str:
    """A kernel script that holds gs.lease(gpus=2), then runs `body`."""
    return HOLD + textwrap.dedent(body)


def _held(k) -> dict:
    return json.loads(k.wait_for_line("HELD ")[len("HELD "):])


def _row(broker, admin, lease_id: int) -> dict:
    return next(r for r in client.call(broker.leases, admin, True) if r["lease_id"] == lease_id)


def test_a_held_lease_runs_two_calls_on_one_lease_stays_held_between_them_and_release_frees_its_gpus(
        kernel, other_account, broker, admin):
    k = kernel(holding("""
        first = lease.run(where, 21)
        print("BETWEEN", flush=True)
        sys.stdin.readline()  # while the test looks at the broker
        second = lease.run(where, 5)
        info, receipt = lease.info, lease.info.receipt()
        lease.release()
        try:
            lease.run(where, 1)
        except gs.GPUSessionError as exc:
            after = str(exc)
        say(first=first, second=second, lease_id=lease.lease_id, released=lease.released, repr=repr(lease),
            end=info.end_reason, receipt=receipt, after=after, ray="ray" in sys.modules,
            order=[e for e in EVENTS if e != "output"])
    """), account=other_account)
    held = _held(k)
    assert held["gpus"] == 2 and f"<gpusession.Lease {held['lease_id']}: 2 GPUs, 2 workers, held>" == held["repr"]
    k.wait_for_line("BETWEEN")
    row = _row(broker, admin, held["lease_id"])  # held between runs, for the kernel's account
    assert row["state"] == "placed" and row["user"] == other_account.pw_name, row
    assert free_gpus() == CLUSTER_GPUS - 2
    k.tell()
    got = k.result()
    assert got["first"] == {"lease": held["lease_id"], "world": 2, "double": 42}, got
    assert got["second"] == {"lease": held["lease_id"], "world": 2, "double": 10}, got
    assert got["lease_id"] == held["lease_id"] and got["released"] and got["repr"].endswith("released>"), got
    assert got["end"] == "finished" and "still held" in got["receipt"], got["receipt"]
    assert "already released; get GPUs again with gs.lease" in got["after"], got["after"]
    assert got["ray"] is False, "the kernel imported ray"
    assert got["order"][0] == "requesting" and got["order"].count("finished") == 2, got["order"]
    assert got["order"][-1] == "released" and got["order"].count("released") == 1, got["order"]
    assert sum(1 for line in k.lines if "ran on rank" in line) == 4
    assert gpus_free_everywhere(broker, admin)  # release() returns once Ray shows the GPUs free
    assert _row(broker, admin, held["lease_id"])["state"] == "ended"


def test_a_run_over_its_accounts_bytes_on_a_held_lease_is_refused_and_the_lease_stays_held_for_the_next(
        kernel, broker, admin):
    from .conftest import CALL_BYTES

    k = kernel(holding(f"""
        import numpy as np

        def size(x):
            return x.nbytes

        try:
            lease.run(size, np.zeros({CALL_BYTES + 2**20} // 8))
            refused = None
        except gs.QuotaExceeded as exc:
            refused = str(exc)
        print("REFUSED " + json.dumps({{"refused": refused}}), flush=True)
        sys.stdin.readline()  # while the test looks at the broker
        under = lease.run(size, np.zeros({CALL_BYTES - 2**20} // 8))
        lease.release()
        say(under=under)
    """))
    held = _held(k)
    refused = json.loads(k.wait_for_line("REFUSED ")[len("REFUSED "):])["refused"]
    assert refused is not None and "257.0 MiB" in refused and "--call-bytes-per-user" in refused, refused
    assert _row(broker, admin, held["lease_id"])["state"] == "placed"
    k.tell()
    assert k.result()["under"] == CALL_BYTES - 2**20
    wait_for(lambda: gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S, message="every GPU free")


def test_killing_a_kernel_that_holds_an_idle_lease_frees_its_gpus_within_5_s(kernel, broker, admin):
    k = kernel(holding("""
        lease.run(where, 1)
        print("IDLE", flush=True)
        time.sleep(600)
    """))
    _held(k)
    k.wait_for_line("IDLE")
    assert free_gpus() == CLUSTER_GPUS - 2
    kill_and_see_gpus_freed(k, broker, admin, what="the idle kernel")


def test_killing_a_kernel_mid_run_on_its_held_lease_frees_its_gpus_within_5_s(kernel, broker, admin):
    k = kernel(holding("""
        lease.run(forever)
    """))
    lease_id = _held(k)["lease_id"]
    k.wait_for_line("[rank 0] RUNNING")
    kill_and_see_gpus_freed(k, broker, admin, what="the running kernel")
    assert _row(broker, admin, lease_id)["state"] == "ended"


def test_the_stop_button_ends_a_run_on_a_held_lease_and_the_with_block_releases_it(kernel, broker, admin):
    k = kernel(holding("""
        STOP_ON.append("RUNNING")  # the observer's poll raises KeyboardInterrupt once a rank printed it
        try:
            with lease:
                lease.run(forever)
        except KeyboardInterrupt as exc:
            say(raised=type(exc).__name__, end=lease.info.end_reason, released=lease.released)
    """))
    lease_id = _held(k)["lease_id"]
    got = k.result()
    assert got == {"raised": "KeyboardInterrupt", "end": "interrupted", "released": True}, got
    assert gpus_free_everywhere(broker, admin)
    assert _row(broker, admin, lease_id)["end_reason"] == "interrupted"


def test_another_account_has_no_way_to_name_use_or_release_a_held_lease(kernel, other_account, broker, admin):
    owner = kernel(holding("""
        sys.stdin.readline()  # while the other account tries
        again = lease.run(where, 4)
        lease.release()
        say(again=again)
    """))
    lease_id = _held(owner)["lease_id"]
    intruder = kernel(f"""
        from gpusession.gateway.client import connect

        def answer(kind, payload=(), **fields):
            conn, _ = connect("run")
            try:
                conn.send(kind, payload, **fields)
                got = conn.receive()
                return got.kind, (got.get("error") or {{}}).get("message", "")
            finally:
                conn.close()

        tried = {{
            "release": answer("release", lease_id={lease_id}, reason="finished"),
            "run": answer("run", [b"x"], lease_id={lease_id}, name="f", cwd="/", buffers=0),
            "cancel": answer("cancel", run_id=str({lease_id})),
        }}
        say(tried=tried)
    """, account=other_account)
    tried = intruder.result()["tried"]
    assert tried["release"][0] == "failed" and "begins with run, lease or checkpoint" in tried["release"][1], tried
    assert tried["run"][0] == "failed" and "options" in tried["run"][1], tried
    assert tried["cancel"][0] == "failed" and "run_id must be" in tried["cancel"][1], tried
    assert _row(broker, admin, lease_id)["state"] == "placed"  # still the owner's, untouched
    owner.tell()
    assert owner.result()["again"]["lease"] == lease_id
    assert gpus_free_everywhere(broker, admin)


def test_bad_lease_options_are_refused_with_the_local_errors_and_nothing_is_held(kernel, cluster, quiet, broker,
                                                                                  admin):
    from gpusession.identity import current_identity

    local = {}
    for name, options in (("priority", {"priority": "high"}), ("too_many", {"gpus": 2 * CLUSTER_GPUS})):
        with pytest.raises(gs.GPUSessionError) as raised:
            gs.lease(**options)
        local[name] = [type(raised.value).__name__, str(raised.value).replace(current_identity().user, "USER")]
    k = kernel("""
        import getpass
        tried = {}
        for name, options in (("runtime_env", {"runtime_env": {"env_vars": {"A": "1"}}}),
                              ("priority", {"priority": "high"}), ("too_many", {"gpus": 8})):
            try:
                gs.lease(**options)
                tried[name] = ["held", ""]
            except Exception as exc:
                tried[name] = [type(exc).__name__, str(exc).replace(getpass.getuser(), "USER")]
        say(tried=tried)
    """)
    tried = k.result()["tried"]
    assert tried["runtime_env"][0] == "InvalidRequest", tried
    assert "runtime_env is not available through the gateway" in tried["runtime_env"][1], tried
    assert tried["priority"] == local["priority"] and tried["priority"][0] == "QuotaExceeded", (tried, local)
    assert tried["too_many"] == local["too_many"] and tried["too_many"][0] == "Infeasible", (tried, local)
    assert gpus_free_everywhere(broker, admin)


def test_a_held_elastic_lease_shrinks_for_a_preemption_and_grows_back_while_idle_in_the_gateway(
        kernel, broker, admin):
    """gs.lease(min_gpus=...) through the gateway: the gateway watches the idle lease, so it gives
    up 2 GPUs when the broker asks (no run going, nothing to commit) and takes them back once free;
    each run sees the size of that moment."""
    from gpusession.run.caller.lease import Lease
    from gpusession.identity import Identity
    from gpusession.run.caller.options import validate_run_options

    boss = f"boss-{uuid.uuid4().hex[:6]}"
    client.call(broker.set_quota, boss, {"max_priority": "high"}, admin)
    k = kernel("""
        def rank_sum():
            import torch, torch.distributed as dist
            value = torch.tensor([float(gs.context().rank + 1)])
            dist.all_reduce(value)
            return value.item()

        lease = gs.lease(gpus=4, min_gpus=2, priority="low")
        print("FIRST", lease.lease_id, lease.run(rank_sum), flush=True)
        sys.stdin.readline()  # while a high-priority lease takes 2 of its GPUs
        second = lease.run(rank_sum)
        print("SECOND " + json.dumps([second, lease.workers, lease.info.transitions]), flush=True)
        sys.stdin.readline()  # until the GPUs are free again and the lease grew back
        third = lease.run(rank_sum)
        lease.release()
        say(third=third, resizes=lease.info.resizes, transitions=lease.info.transitions)
    """)
    _, lease_id, first = k.wait_for_line("FIRST ").split()
    assert float(first) == 10.0  # ranks 1 + 2 + 3 + 4
    high = Lease(validate_run_options(gpus=2, priority="high"), identity=Identity(boss)).acquire()
    try:
        assert _row(broker, admin, int(lease_id))["workers"] == 2  # shrunk while idle, not taken back
        k.tell()
        second, workers, transitions = json.loads(k.wait_for_line("SECOND ")[len("SECOND "):])
    finally:
        high.release()
    assert (second, workers) == (3.0, 2), (second, workers)  # ranks 1 + 2
    assert transitions == [f"preempted by lease {high.lease_id} ({boss}, high): 4 -> 2 GPUs between runs"]
    wait_for(lambda: _row(broker, admin, int(lease_id))["workers"] == 4, timeout=15.0,
             message="the held lease back at 4 GPUs")
    k.tell()
    got = k.result()
    assert got == {"third": 10.0, "resizes": 2, "transitions": ["4 GPUs again between runs"]}, got
    assert gpus_free_everywhere(broker, admin)
    client.call(broker.reset_quota, boss, admin)
