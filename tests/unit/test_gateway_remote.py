"""The kernel's side of the run session (gateway/remote.py) against a fake gateway that plays the
service's part of the protocol (hosted.py) without Ray: events rendered on the caller's observer,
the result unpickled in the caller, errors rebuilt, the stop button, a gateway that goes away."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import gpusession as gs
from gpusession import errors
from gpusession.observe.events import Observer, RunInfo
from gpusession.gateway.chunks import gather, send_chunked
from gpusession.gateway.client import GATEWAY_ENV
from gpusession.gateway.runwire import error_to_json, info_to_json
from gpusession.gateway.server import GatewayServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_run(conn, caller, hello):
    """The service's part, played: what it does depends on the function's name."""
    message = gather(conn, conn.receive())
    name, info = message.get("name"), RunInfo(lease_id=5, gpus=2, workers=2)
    conn.send("event", event="requesting", gpus=2, workers=2)
    conn.send("event", event="granted", info=info_to_json(info, checkpoint=None))
    if name == "answer":
        conn.send("event", event="output", rank=0, stream="stdout", text="hi\n")
        info.history.append({"step": 1})
        conn.send("event", event="report", metrics={"step": 1}, info=info_to_json(info, checkpoint="h1"))
        info.released = True
        conn.send("event", event="released", info=info_to_json(info, checkpoint="h1"))
        # the kernel's own call, sent back as its result: the fake never unpickles them either
        send_chunked(conn, "done", message.payload, info=info_to_json(info, checkpoint="h1"), error=None,
                     values={"all": False, "items": [len(message.payload) - 1]})
    elif name == "broken":
        failed = errors.WorkerFailed("rank 1 raised", rank=1, node="n", remote_type="ValueError",
                                     remote_message="bad", remote_traceback="Traceback\nValueError: bad")
        conn.send("done", info=info_to_json(info, checkpoint=None), error=error_to_json(failed), values=None)
    elif name == "spin":
        stop = conn.receive()
        info.end_reason = "interrupted"
        conn.send("done", info=info_to_json(info, checkpoint=None),
                  error={"type": "KeyboardInterrupt", "message": stop.get("message")}, values=None,
                  said=stop.get("reason"))
    elif name == "vanish":
        conn.close()


@pytest.fixture(scope="module")
def gateway():
    folder = tempfile.mkdtemp(prefix="gs-remote-test-")
    path = os.path.join(folder, "run.sock")
    server = GatewayServer(path, {"run": fake_run}).start()
    yield path
    server.stop()
    os.rmdir(folder)


class Recorder(Observer):
    def __init__(self, stop_after: int | None = None):
        self.events, self.polls, self.stop_after = [], 0, stop_after

    def requesting(self, gpus, workers): self.events.append(("requesting", gpus, workers))
    def granted(self, info): self.events.append(("granted", info.lease_id))
    def output(self, rank, stream, text): self.events.append(("output", rank, text))
    def report(self, metrics, info): self.events.append(("report", metrics, len(info.history)))
    def released(self, info): self.events.append(("released", info.released))
    def finished(self, info, error): self.events.append(("finished", type(error).__name__ if error else None))

    def poll(self):
        self.polls += 1
        if self.stop_after is not None and self.polls >= self.stop_after:
            raise KeyboardInterrupt("stop button")


def _function(name):
    def body(*args):
        return args
    body.__name__ = body.__qualname__ = name
    return body


def test_events_render_on_the_callers_observer_and_the_result_is_unpickled_writable(gateway, monkeypatch):
    monkeypatch.setenv(GATEWAY_ENV, gateway)
    recorder = Recorder()
    fn = gs.DistributedFunction(_function("answer"), gs.distributed(gpus=2)(lambda: 0).options, observer=recorder)
    big = np.arange(2**18, dtype=np.float64)  # 2 MB: out of band
    _, back, _ = fn(big, "small")  # the fake sends the call back: (fn, args, kwargs)
    assert back[0] is not big and np.array_equal(back[0], big) and back[1] == "small"
    back[0][0] = -1.0  # the caller's own copy
    assert recorder.events == [("requesting", 2, 2), ("granted", 5), ("output", 0, "hi\n"),
                               ("report", {"step": 1}, 1), ("released", True), ("finished", None)]
    info = fn.last_run
    assert info.lease_id == 5 and info.history == [{"step": 1}] and info.end_reason == "finished"
    assert info.checkpoint_ref.handle == "h1"


def test_a_remote_error_is_raised_as_the_local_path_raises_it(gateway, monkeypatch):
    monkeypatch.setenv(GATEWAY_ENV, gateway)
    fn = gs.DistributedFunction(_function("broken"), gs.distributed(gpus=2)(lambda: 0).options, observer=Recorder())
    with pytest.raises(errors.WorkerFailed) as raised:
        fn()
    assert raised.value.remote_type == "ValueError" and "ValueError: bad" in str(raised.value)
    assert fn.last_run.end_reason == "failed"


def test_the_stop_button_asks_the_gateway_to_stop_waits_for_the_end_and_raises_the_kernels_own_error(
        gateway, monkeypatch):
    monkeypatch.setenv(GATEWAY_ENV, gateway)
    recorder = Recorder(stop_after=1)
    fn = gs.DistributedFunction(_function("spin"), gs.distributed(gpus=2)(lambda: 0).options, observer=recorder)
    with pytest.raises(KeyboardInterrupt, match="stop button"):
        fn()
    assert fn.last_run.end_reason == "interrupted" and recorder.events[-1] == ("finished", "KeyboardInterrupt")


def test_a_gateway_that_goes_away_mid_run_fails_the_call_saying_so(gateway, monkeypatch):
    monkeypatch.setenv(GATEWAY_ENV, gateway)
    fn = gs.DistributedFunction(_function("vanish"), gs.distributed(gpus=2)(lambda: 0).options, observer=Recorder())
    with pytest.raises(errors.GPUSessionError, match="gateway's connection ended"):
        fn()


def test_a_kernel_that_runs_through_the_gateway_never_imports_ray(gateway):
    code = f"""
import json, sys
import gpusession as gs
from gpusession.observe import events
events.set_observer_factory(lambda workers: events.Observer())

@gs.distributed(gpus=2)
def answer(x):
    return x

print(json.dumps({{"value": answer(41)[1][0], "ray": "ray" in sys.modules}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env[GATEWAY_ENV] = gateway
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"value": 41, "ray": False}
