"""The run session's JSON parts (gateway/runwire.py, hosted.run_request): options re-validated on
the service's side, RunInfo and events as they travel, errors rebuilt by name (never unpickled)."""
from __future__ import annotations

import json
import pickle

import pytest

import gpusession as gs
from gpusession import errors
from gpusession.run.comm_options import CommReport, validate_comm_options
from gpusession.observe.events import RunInfo
from gpusession.gateway.frames import Message
from gpusession.gateway.hosted import run_request
from gpusession.gateway.shelf import Shelf
from gpusession.gateway.runwire import (BadRunMessage, add_report, apply_info, error_from_json, error_to_json,
                                        info_to_json, options_from_json, options_to_json, plain, stop_error,
                                        stop_reason)
from gpusession.api.distributed import parse_options


def _travel(data):
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("given", [
    {},
    {"gpus": 4, "gpus_per_worker": 2, "min_gpus": 2, "priority": "high", "placement": "spread",
     "timeout": "10m", "queue_timeout": 30, "backend": "gloo", "max_failures": 0, "return_all": True,
     "runtime_env": {"env_vars": {"A": "1"}}, "retry_exceptions": (TimeoutError, KeyError)},
    {"gpus": 1, "gpus_per_worker": 0.5, "grad_compression": gs.PowerSGD(rank=4, warmup_steps=20),
     "bucket_mb": 50, "precision": "bf16"},
    {"gpus": 2, "grad_compression": "fp16", "retry_exceptions": True},
])
def test_options_round_trip_through_json_and_the_services_validation(given):
    options = parse_options(given, where="test")
    assert options_from_json(_travel(options_to_json(options))) == options


def test_a_sweeps_trial_keeps_its_sweep_id():
    import dataclasses

    options = parse_options({"gpus": 1}, where="test")
    options = dataclasses.replace(options, lease=dataclasses.replace(options.lease, sweep_id="sweep-1a2b"))
    assert options_from_json(_travel(options_to_json(options))).lease.sweep_id == "sweep-1a2b"


@pytest.mark.parametrize("bad, field", [
    ({"gpus": -1}, "gpus"), ({"gpus": 3, "gpus_per_worker": 2}, "gpus"), ({"colour": "red"}, "colour"),
    ({"backend": "mpi"}, "backend"), ({"retry_exceptions": ["os.system(1)"]}, "retry_exceptions"),
    ({"retry_exceptions": "builtins.KeyError"}, "retry_exceptions"), ({"sweep_id": "../x"}, "sweep_id"),
    ({"max_failures": True}, "max_failures"),
])
def test_options_a_kernel_should_not_send_are_refused_naming_the_field(bad, field):
    with pytest.raises(BadRunMessage, match=field):
        options_from_json(bad)


def test_options_that_are_not_an_object_are_refused():
    with pytest.raises(BadRunMessage, match="object"):
        options_from_json(["gpus", 2])


def test_a_runtime_env_that_is_not_json_is_refused_in_the_kernel_before_anything_is_sent():
    options = parse_options({"runtime_env": {"env_vars": {"A": object()}}}, where="test")
    with pytest.raises(TypeError, match="runtime_env"):
        options_to_json(options)


def test_run_info_travels_and_the_kernels_history_follows_the_services():
    service = RunInfo(lease_id=7, gpus=2, workers=2, backend="gloo", nodes=["n1"], queued_s=0.5,
                      transitions=["restarted"], rank_hosts={0: "a (1.2.3.4)", 1: "b"}, state="running",
                      shipped_bytes=10, returned_bytes=20, returned_s=0.5, checkpoint_step=3)
    service.communication = CommReport(validate_comm_options(grad_compression="powersgd:rank=3,warmup=12",
                                                             precision="bf16"), True, steps=5, bytes_last_step=9)
    kernel = RunInfo()
    for step in (1, 2, 3):
        service.history.append({"step": step})
        add_report(kernel, {"step": step}, _travel(info_to_json(service, checkpoint=None)))
    handle = apply_info(kernel, _travel(info_to_json(service, checkpoint="abc")))
    assert handle == "abc"
    assert kernel.history == service.history
    for name in ("lease_id", "gpus", "workers", "backend", "nodes", "queued_s", "transitions", "rank_hosts",
                 "state", "shipped_bytes", "returned_bytes", "returned_s", "checkpoint_step",
                 "communication"):
        assert getattr(kernel, name) == getattr(service, name), name
    # a restart drops the steps it redoes: the next report replaces them in the kernel too
    del service.history[1:]
    service.history.append({"step": 2, "again": True})
    add_report(kernel, {"step": 2, "again": True}, _travel(info_to_json(service, checkpoint="abc")))
    assert kernel.history == service.history


def test_errors_are_rebuilt_by_name_with_the_remote_account_and_anything_else_is_a_gpusession_error():
    failed = errors.WorkerFailed("rank 1 raised", rank=1, node="n1", remote_type="ValueError",
                                 remote_message="bad", remote_traceback="Traceback ...\nValueError: bad")
    rebuilt = error_from_json(_travel(error_to_json(failed)))
    assert type(rebuilt) is errors.WorkerFailed and str(rebuilt) == str(failed)
    assert (rebuilt.rank, rebuilt.remote_type, rebuilt.remote_message) == (1, "ValueError", "bad")
    too_large = errors.ResultTooLarge("Rank 0's result (315 MB) did not fit", rank=0, node="n2",
                                      remote_type="ResultTooLarge", remote_message="OutOfDiskError: ...")
    rebuilt = error_from_json(_travel(error_to_json(too_large)))
    assert type(rebuilt) is errors.ResultTooLarge and isinstance(rebuilt, errors.WorkerFailed)
    assert (rebuilt.rank, rebuilt.node, str(rebuilt)) == (0, "n2", str(too_large))
    assert type(pickle.loads(pickle.dumps(too_large))) is errors.ResultTooLarge  # a background run's thread hands it on
    for error in (errors.QueueTimeout("no GPUs in 30 s"), errors.RunCancelled("cancelled"),
                  errors.GPUSessionError("plain"), ValueError("too big"), TypeError("unpicklable")):
        again = error_from_json(_travel(error_to_json(error)))
        assert type(again) is type(error) and str(again) == str(error)
    assert isinstance(error_from_json({"type": "KeyboardInterrupt", "message": ""}), KeyboardInterrupt)
    strange = error_from_json({"type": "os.system", "message": "x"})
    assert type(strange) is errors.GPUSessionError and "os.system: x" in str(strange)
    assert type(error_from_json("not an object")) is errors.GPUSessionError


def test_a_stop_ends_the_service_side_run_as_the_kernels_own_stop_would():
    assert stop_reason(KeyboardInterrupt()) == "interrupted"
    assert stop_reason(errors.RunCancelled("x")) == "cancelled"
    assert isinstance(stop_error("cancelled", "run 3 cancelled"), errors.RunCancelled)
    assert isinstance(stop_error("interrupted", None), KeyboardInterrupt)
    assert isinstance(stop_error({"odd": 1}, "x" * 5000), KeyboardInterrupt)


def test_plain_makes_a_queue_view_json_safe():
    assert json.loads(json.dumps(plain({"position": 2, "why": object, 3: (1.5, None)})))["3"] == [1.5, None]


def _run_message(**override):
    fields = dict(name="train", cwd="/home/ann", options={"gpus": 2}, buffers=1, checkpoint=None,
                  checkpoint_step=None, asking={"notebook": "a.ipynb", "cell_id": "c1", "background": False})
    fields.update(override)
    return Message("run", fields, [b"pickle", bytearray(b"buffer")])


def test_a_run_message_is_checked_field_by_field():
    request = run_request(_run_message())
    assert request.name == "train" and request.cwd == "/home/ann" and request.options.lease.gpus == 2
    assert request.header == b"pickle" and request.buffers == [bytearray(b"buffer")]
    for override, field in [({"name": ""}, "name"), ({"cwd": "relative"}, "cwd"), ({"buffers": 2}, "buffers"),
                            ({"buffers": True}, "buffers"), ({"checkpoint": 5}, "checkpoint"),
                            ({"checkpoint_step": "x"}, "checkpoint_step"), ({"asking": []}, "asking"),
                            ({"options": {"gpus": 0}}, "gpus"),
                            ({"options": {"runtime_env": {"env_vars": {"LD_PRELOAD": "/tmp/x.so"}}}}, "runtime_env")]:
        with pytest.raises(BadRunMessage, match=field):
            run_request(_run_message(**override))


def test_the_shelf_keeps_one_checkpoint_per_run_a_few_runs_per_account_and_only_for_that_account():
    shelf = Shelf(per_user=2)
    first = shelf.keep("ann", "ref1")
    second = shelf.keep("ann", "ref2", replacing=first)  # the same run's next commit
    assert shelf.get("ann", first) is None and shelf.get("ann", second) == "ref2"
    assert shelf.get("bob", second) is None and shelf.get("ann", 12) is None
    third, fourth = shelf.keep("ann", "ref3"), shelf.keep("ann", "ref4")
    assert shelf.get("ann", second) is None and shelf.get("ann", third) == "ref3" and shelf.get("ann", fourth)


def test_a_message_with_more_frames_than_one_message_carries_arrives_whole_and_in_order():
    import socket
    import threading

    from gpusession.gateway.chunks import gather, send_chunked
    from gpusession.gateway.frames import Connection, FrameError

    left, right = socket.socketpair()
    sender, receiver = Connection(left), Connection(right)
    frames = [bytes([i % 256]) * (i + 1) for i in range(150)]
    thread = threading.Thread(target=send_chunked, args=(sender, "done", frames), kwargs={"info": {"a": 1}})
    thread.start()
    got = gather(receiver, receiver.receive())
    thread.join()
    assert got.kind == "done" and got.fields == {"info": {"a": 1}} and got.payload == frames
    sender.send("run", [b"x"], frames=3)
    sender.send("stop")
    with pytest.raises(FrameError, match="stop"):
        gather(receiver, receiver.receive())
    sender.send("run", [b"x"], frames=-1)
    with pytest.raises(FrameError, match="-1"):
        gather(receiver, receiver.receive())
    sender.close(), receiver.close()


class _FakeLease:
    lease_id = 9

    def __init__(self):
        self.dropped = 0

    def drop_group(self):
        self.dropped += 1


def test_a_run_that_cannot_poll_when_its_kernel_is_gone_loses_its_group_after_the_grace_and_only_then():
    import threading

    from gpusession.gateway.hosted import StopWatch, free_when_gone

    def watch(gone: bool) -> StopWatch:
        w = StopWatch(conn=None)
        w.gone = gone
        w.ended.set()
        return w

    stuck, lease = threading.Event(), _FakeLease()
    assert free_when_gone(watch(True), lease, stuck, grace_s=0.01) and lease.dropped == 1
    ended = threading.Event()
    ended.set()
    assert not free_when_gone(watch(True), lease, ended, grace_s=0.01)  # it ended by its own poll
    assert not free_when_gone(watch(False), lease, stuck, grace_s=0.01)  # the run ended; the kernel is there
    assert lease.dropped == 1


def test_the_gateway_keeps_only_the_step_of_each_report_it_sent_on_and_the_kernel_gets_it_whole():
    import socket
    import threading

    from gpusession.gateway.following import Forwarder, StopWatch
    from gpusession.gateway.frames import Connection
    from gpusession.run.caller import commits

    left, right = socket.socketpair()
    service, kernel = Connection(left), Connection(right)
    forward = Forwarder(service, StopWatch(service), "ann", Shelf())
    info = RunInfo()
    big = {"step": 3, "loss": 0.5, "notes": "x" * 2**20}
    sent = []
    for metrics in ({"step": 1, "loss": 1.0}, {"loss": 0.7}, big, {"step": "late", "loss": 0.1}):
        info.history.append(metrics)  # as the run path does before it tells its observers
        reader = threading.Thread(target=lambda: sent.append(kernel.receive()))
        reader.start()
        forward.report(metrics, info)
        reader.join()
    assert sent[2].get("metrics") == big and [m.get("info")["history_len"] for m in sent] == [1, 2, 3, 4]
    assert info.history == [{"step": 1}, {}, {"step": 3}, {}]
    assert commits.last_step(info.history) == 3 and big["notes"]  # what a commit reads; the kernel's dict untouched
    service.close(), kernel.close()
