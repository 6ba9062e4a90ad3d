"""A held lease through the gateway without Ray: the kernel's side (gateway/remotelease.py) against
a fake gateway that plays the service's part of the lease messages (heldlease.py), and the
service's reader of those messages (following.StopWatch) on a real socket pair; the lease
request's checks (runrequest.py)."""
from __future__ import annotations

import os
import queue
import socket
import tempfile
import threading

import pytest

import gpusession as gs
from gpusession import errors
from gpusession.run.caller import holding
from gpusession.observe.events import Observer, RunInfo
from gpusession.gateway.chunks import gather, send_chunked
from gpusession.gateway.client import GATEWAY_ENV
from gpusession.gateway.following import StopWatch
from gpusession.gateway.frames import Connection, Message
from gpusession.gateway.runrequest import lease_request
from gpusession.gateway.runwire import BadRunMessage, error_to_json, info_to_json, options_to_json
from gpusession.gateway.server import GatewayServer
from gpusession.run.caller.options import validate_run_options

TOLD: list = []  # what the fake gateway was told: ("release", reason), ("stop", reason)
SPINNING = threading.Event()  # the fake has the run "spin" going


def _send(conn, kind, info, **fields):
    conn.send(kind, info=info_to_json(info, checkpoint=None), **fields)


def fake_lease(conn, caller, hello):
    """The service's part of a held lease, played: lease 9 of 2 GPUs, each run echoes its call."""
    first = conn.receive()
    if first.get("options", {}).get("gpus") == 3:
        failed = errors.Infeasible("Needs 3 GPUs; the cluster has 2.")
        return _send(conn, "done", RunInfo(), error=error_to_json(failed), values=None)
    info = RunInfo(lease_id=9, gpus=2, workers=2)
    _send(conn, "event", info, event="granted")
    _send(conn, "done", info, error=None, values=None)
    while True:
        message = conn.receive()
        if message.kind == "release":
            TOLD.append(("release", message.get("reason")))
            info.released = True
            _send(conn, "event", info, event="released")
            return _send(conn, "done", info, error=None, values=None)
        message = gather(conn, message)
        if message.get("name") == "spin":
            SPINNING.set()
            stop = conn.receive()
            TOLD.append(("stop", stop.get("reason")))
            _send(conn, "done", info, error={"type": "RunCancelled", "message": stop.get("message")}, values=None)
        elif message.get("name") == "vanish":
            return conn.close()
        else:  # the kernel's own call sent back as its value: the fake never unpickles it either
            send_chunked(conn, "done", message.payload, info=info_to_json(info, checkpoint=None), error=None,
                         values={"all": False, "items": [len(message.payload) - 1]})


@pytest.fixture
def gateway(monkeypatch):
    folder = tempfile.mkdtemp(prefix="gs-held-lease-test-")
    path = os.path.join(folder, "run.sock")
    server = GatewayServer(path, {"run": fake_lease}).start()
    monkeypatch.setenv(GATEWAY_ENV, path)
    TOLD.clear()
    SPINNING.clear()
    yield path
    server.stop()
    os.rmdir(folder)


class Recorder(Observer):
    def __init__(self):
        self.events = []

    def requesting(self, gpus, workers): self.events.append("requesting")
    def granted(self, info): self.events.append("granted")
    def released(self, info): self.events.append("released")
    def finished(self, info, error): self.events.append(("finished", type(error).__name__ if error else None))


@pytest.fixture
def recorder(monkeypatch):
    from gpusession.observe import events

    seen = Recorder()
    monkeypatch.setattr(events, "_factory", lambda workers: seen)
    return seen


def echo(*args):
    return args


def test_a_held_lease_runs_twice_on_one_lease_and_the_with_block_releases_it_with_its_reason(gateway, recorder):
    with gs.lease(gpus=2) as lease:
        assert repr(lease) == "<gpusession.Lease 9: 2 GPUs, 2 workers, held>"
        assert lease in holding.held_leases()  # what %gpu status lists
        first = lease.run(echo, 1, "a")
        second = lease.run(echo, 2)
    assert first[1] == (1, "a") and second[1] == (2,)  # the fake sends (fn, args, kwargs) back
    assert lease.released and repr(lease).endswith("released>") and lease not in holding.held_leases()
    assert TOLD == [("release", "finished")]
    assert recorder.events == ["requesting", "granted", ("finished", None), ("finished", None), "released"]
    with pytest.raises(gs.GPUSessionError, match="already released; get GPUs again with gs.lease"):
        lease.run(echo)


def test_release_from_another_thread_stops_the_run_going_on_first(gateway, recorder):
    lease = gs.lease(gpus=2)
    raised: list = []

    def spin():
        try:
            lease.run(_named("spin"))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            raised.append(exc)

    running = threading.Thread(target=spin)
    running.start()
    assert SPINNING.wait(10)
    lease.release()
    running.join(10)
    assert isinstance(raised[0], gs.RunCancelled) and "was released while this run went on" in str(raised[0])
    assert TOLD == [("stop", "cancelled"), ("release", "finished")] and lease.released


def test_a_gateway_that_goes_away_mid_run_leaves_the_lease_released(gateway, recorder):
    lease = gs.lease(gpus=2)
    with pytest.raises(gs.GPUSessionError, match="gateway's connection ended"):
        lease.run(_named("vanish"))
    assert lease.released and lease not in holding.held_leases()
    lease.release()  # idempotent: nothing left to tell


def test_a_lease_the_gateway_refuses_raises_its_error_by_name_and_holds_nothing(gateway, recorder):
    with pytest.raises(gs.Infeasible, match="Needs 3 GPUs"):
        gs.lease(gpus=3)
    assert holding.held_leases() == []


def _named(name):
    def body():
        return None
    body.__name__ = body.__qualname__ = name
    return body


# ----- the service's reader of a held lease's connection ---------------------------------------------------
def _reader() -> tuple[Connection, queue.Queue, StopWatch]:
    ours, theirs = socket.socketpair()
    requests = queue.Queue()
    return Connection(theirs), requests, StopWatch(Connection(ours), requests=requests).start()


def test_the_lease_sessions_reader_queues_runs_and_releases_in_turn_and_a_run_clears_the_stop_before_it():
    kernel, requests, watch = _reader()
    try:
        kernel.send("stop", reason="interrupted", message="the stop button")  # while the lease was asked for
        watch.answered()  # the lease is held: the kernel may ask for a run
        send_chunked(kernel, "run", [b"pickle", b"buffer"], name="f", cwd="/", buffers=1)
        run = requests.get(timeout=5)
        assert run.kind == "run" and run.payload == [b"pickle", b"buffer"] and watch.error is None
        kernel.send("stop", reason="cancelled", message="cancelled")
        watch.answered()
        kernel.send("release", reason="finished")
        assert requests.get(timeout=5).kind == "release"
        assert isinstance(watch.error, gs.RunCancelled) and not watch.gone
    finally:
        kernel.close()
    assert requests.get(timeout=5) is None and watch.gone  # the kernel left: the session releases


@pytest.mark.parametrize("sent", ["a second run before the first was answered", "a message of no lease session"])
def test_a_request_out_of_turn_ends_a_lease_sessions_connection(sent):
    kernel, requests, watch = _reader()
    watch.answered()
    if sent.startswith("a second run"):
        kernel.send("run", [b"pickle"], name="f", cwd="/", buffers=0)
        assert requests.get(timeout=5).kind == "run"
        kernel.send("run", [b"pickle"], name="f", cwd="/", buffers=0)
    else:
        kernel.send("cancel", run_id="x")
    assert requests.get(timeout=5) is None and watch.gone and isinstance(watch.error, KeyboardInterrupt)
    kernel.close()


def test_a_lease_request_is_checked_as_a_calls_options_and_holds_no_limit_on_its_time():
    options = options_to_json(validate_run_options(gpus=2, timeout="10m"))
    request = lease_request(Message("lease", {"options": options, "asking": {"notebook": "a.ipynb", "x": 1}}))
    assert request.options.lease.gpus == 2 and request.options.timeout_s == 600  # each run's limit
    assert request.options.lease.max_hold_s is None and request.asking["notebook"] == "a.ipynb"
    with pytest.raises(BadRunMessage, match="runtime_env is not available through the gateway"):
        lease_request(Message("lease", {"options": dict(options, runtime_env={"pip": ["x"]})}))
    with pytest.raises(BadRunMessage, match="gpus"):
        lease_request(Message("lease", {"options": dict(options, gpus=-1)}))
    with pytest.raises(BadRunMessage, match="asking must be an object"):
        lease_request(Message("lease", {"options": options, "asking": "x"}))
