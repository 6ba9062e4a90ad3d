"""A live run keeps its server active (issue 32), without Ray: which processes follow a live run
(gateway/following.py), the broker session's answer for the caller's own account, and a real
server backend asking a real gateway socket whose registry holds a detached run this process
follows (jupyter_ext/runactivity.py)."""
from __future__ import annotations

import asyncio
import getpass
import logging
import os
import subprocess
import sys
import tempfile
from functools import partial

import pytest

from gpusession.gateway.acting import ServiceKeys
from gpusession.gateway.brokersession import answer, serve_broker
from gpusession.gateway.client import GATEWAY_ENV
from gpusession.gateway.detached import Registry
from gpusession.gateway.activity import FOLLOWING, Following
from gpusession.gateway.frames import Message
from gpusession.gateway.hosted import serve_run
from gpusession.gateway.peer import Peer
from gpusession.gateway.reattach import open_attach
from gpusession.gateway.server import Caller, GatewayServer
from jupyter_ext.backend import Backend
from jupyter_ext.config import GPUSession
from jupyter_ext.runactivity import SETTING, RunActivity, is_under, parent_of

ANN = Peer(pid=4242, uid=1001, gid=1001, name="ann")
BOB = Peer(pid=4343, uid=1002, gid=1002, name="bob")
KEYS = ServiceKeys(identity_key=b"k" * 64, admin_token="the-admin-token")


def test_a_process_follows_a_run_only_inside_its_block_and_while_the_run_goes_on():
    following, going = Following(), [True]
    with following.live(ANN, going=lambda: going[0]), following.live(BOB):
        assert following.pids(ANN.uid) == [ANN.pid] and following.pids(BOB.uid) == [BOB.pid]
        going[0] = False  # the detached run ended; its kernel still connected
        assert following.pids(ANN.uid) == []
    assert following.pids(BOB.uid) == []


def test_the_gateway_answers_following_for_the_callers_account_alone_without_the_broker():
    asked = []
    with FOLLOWING.live(ANN), FOLLOWING.live(BOB):
        reply = answer(Caller(BOB, admin=True), KEYS, Message("call", {"id": 1, "method": "following"}),
                       lambda *call: asked.append(call))
    assert reply == {"kind": "result", "id": 1, "result": {"pids": [BOB.pid]}} and asked == []


def test_a_process_is_under_its_ancestors_only():
    parents = {30: 20, 20: 10, 10: 1, 40: 1}
    assert is_under(30, 10, parents.get) and is_under(10, 10, parents.get)
    assert not is_under(40, 10, parents.get) and not is_under(10, 30, parents.get)
    assert not is_under(99, 10, parents.get)  # gone: no parent known


def test_a_processs_parent_is_read_from_proc_and_a_gone_one_has_none():
    assert parent_of(os.getpid()) == os.getppid()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert parent_of(child.pid) is None


@pytest.mark.parametrize("value", [-1.0, 0.5, float("inf"), float("nan")])
def test_a_bad_run_activity_interval_is_refused_at_load_naming_the_setting(value):
    from traitlets import TraitError

    with pytest.raises(TraitError, match="GPUSession.run_activity_s must be 0 .off. or seconds >= 1"):
        GPUSession(run_activity_s=value)


class Broker:
    def __call__(self, method: str, args: list):
        return {"version": "test", "protocol": 0, "ledger_id": "L", "policy": {}} if method == "info" else None


@pytest.fixture
def gateway(monkeypatch):
    """A real gateway socket in this process (broker and run sessions); the registry is the test's."""
    registry = Registry()
    folder = tempfile.mkdtemp(prefix="gs-run-activity-")
    path = os.path.join(folder, "gateway.sock")
    server = GatewayServer(path, {"broker": partial(serve_broker, keys=KEYS, broker_call=Broker()),
                                  "run": partial(serve_run, keys=None, registry=registry)}).start()
    monkeypatch.setenv(GATEWAY_ENV, path)
    yield registry
    server.stop()
    os.rmdir(folder)


def _checks(server_pid: int) -> tuple[dict, RunActivity, Backend]:
    backend = Backend(GPUSession(), owner=getpass.getuser(), log=logging.getLogger("test"))
    settings: dict = {}
    return settings, RunActivity(backend, settings, interval_s=1, server_pid=server_pid,
                                 log=logging.getLogger("test")), backend


def test_a_server_counts_as_active_while_a_process_under_it_follows_a_live_run(gateway):
    run = gateway.add(getpass.getuser(), "train", 1, 1, 60)
    conn, _, _ = open_attach(run.run_id)  # this process follows it, as an attached kernel does
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        settings, activity, backend = _checks(server_pid=os.getppid())  # this process runs under its parent
        elsewhere, other, other_backend = _checks(server_pid=stranger.pid)  # ... and not under its child
        try:
            assert asyncio.run(activity.check()) and SETTING in settings
            assert not asyncio.run(other.check()) and elsewhere == {}
            seen = settings[SETTING]
            run.finish({"info": {}, "error": None, "values": None}, [], "finished")
            assert not asyncio.run(activity.check()) and settings[SETTING] == seen  # no longer refreshed
        finally:
            backend.stop()
            other_backend.stop()
    finally:
        conn.close()
        stranger.kill()
        stranger.wait()
