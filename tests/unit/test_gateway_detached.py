"""Detached runs (issue 32) without Ray: the rules (keeping.py), a run's record (detached.py), and
the run session's list / attach / cancel against a real gateway socket whose registry holds runs
of this account and of another; detach refused with the embedded cluster, and nothing to list or
attach where no gateway of the user runs."""
from __future__ import annotations

import getpass
import json
import math
import os
import tempfile
import time
from functools import partial

import pytest

import gpusession as gs
from gpusession import errors
from gpusession.observe.events import Observer, RunInfo
from gpusession.gateway import keeping
from gpusession.gateway.client import GATEWAY_ENV
from gpusession.gateway.detached import Registry
from gpusession.gateway.intake import CallBytes
from gpusession.gateway.hosted import run_request, serve_run
from gpusession.gateway.frames import Message
from gpusession.gateway.runwire import BadRunMessage, error_to_json, info_to_json, options_to_json
from gpusession.gateway.server import GatewayServer
from gpusession.run.caller.options import validate_run_options

ME = getpass.getuser()


# ----- the rules -----------------------------------------------------------------------------------
def test_max_duration_defaults_nowhere_and_refuses_what_is_not_a_finite_positive_number():
    assert keeping.max_duration_of(60) == 60.0
    for bad in (math.inf, math.nan, 0, -1, None, "1h", True, keeping.MAX_MAX_DURATION_S + 1):
        with pytest.raises(ValueError, match="max_duration"):
            keeping.max_duration_of(bad)


def test_the_detach_field_is_null_or_a_finite_limit_whose_null_is_the_gateways_default():
    assert keeping.detach_from_json(None) is None
    assert keeping.detach_from_json({"max_duration": 5}) == 5.0
    assert keeping.detach_from_json({"max_duration": None}) == keeping.DEFAULT_MAX_DURATION_S
    assert keeping.detach_from_json({"max_duration": None}, 600.0) == 600.0
    for bad in ({}, {"max_duration": 1e400}, {"max_duration": 0}, [], "yes"):
        with pytest.raises(BadRunMessage, match="detach"):
            keeping.detach_from_json(bad)


@pytest.mark.parametrize("max_duration, retention, says", [
    ("0", None, "--detach-max-duration must be a time above 0"),
    ("forever", None, "--detach-max-duration must be a time above 0"),
    ("31d", None, "--detach-max-duration is at most"),
    (None, "10s", "--detach-retention is how long an ended detached run's result"),
    (None, "400d", "from 60 s to 365 days"),
    (None, True, "--detach-retention must be a time above 0"),
])
def test_an_admins_bad_detach_policy_is_refused_naming_the_option(max_duration, retention, says):
    with pytest.raises(ValueError, match=says):
        keeping.detach_policy(max_duration, retention)


def test_an_admins_detach_policy_from_options_or_a_users_own_variables():
    assert keeping.detach_policy() == keeping.DetachPolicy(24 * 3600.0, 7 * 24 * 3600.0)
    assert keeping.detach_policy("8h", "3d") == keeping.DetachPolicy(8 * 3600.0, 3 * 86400.0)
    assert keeping.detach_policy(600, None).default_max_duration_s == 600.0
    own = keeping.detach_policy_from_env({keeping.MAX_DURATION_ENV: "90m", keeping.RETENTION_ENV: ""})
    assert own == keeping.DetachPolicy(5400.0, 7 * 24 * 3600.0)
    with pytest.raises(ValueError, match=keeping.RETENTION_ENV):
        keeping.detach_policy_from_env({keeping.RETENTION_ENV: "1s"})


def test_the_hubs_gateway_takes_the_policy_flags_before_its_arguments():
    from gpusession.gateway.main import _leading_flags

    assert _leading_flags(["--detach-max-duration", "600", "--call-bytes-per-user", "8G", "--detach-retention", "3600",
                           "s", "db", "ann"]) == (
        {"--detach-max-duration": "600", "--detach-retention": "3600", "--call-bytes-per-user": "8G"},
        ["s", "db", "ann"])
    assert _leading_flags(["s", "db"]) == ({}, ["s", "db"])
    with pytest.raises(ValueError, match="--detach-retention needs a value"):
        _leading_flags(["--detach-retention"])
    with pytest.raises(ValueError, match=r"--call-bytes-per-user needs a value \(bytes, or e.g. 8G\)"):
        _leading_flags(["--call-bytes-per-user"])


def test_a_registry_keeps_ended_runs_for_its_policys_retention_and_says_so_in_each_row():
    registry = Registry(keeping.DetachPolicy(retention_s=3600.0))
    run = registry.add("ann", "f", 1, 1, 60)
    run.ended_at = run.started_at + 5
    assert run.row()["expires"] == run.ended_at + 3600.0


def test_time_limit_retention_and_expiry_decisions():
    assert not keeping.over_time(100.0, 10.0, 109.9) and keeping.over_time(100.0, 10.0, 110.0)
    assert not keeping.expired(None, 1e12)  # a live run never expires
    assert not keeping.expired(100.0, 100.0 + keeping.RETENTION_S - 1)
    assert keeping.expired(100.0, 100.0 + keeping.RETENTION_S)
    assert keeping.expires_at(100.0, 10.0, 150.0) == 150.0 + keeping.RETENTION_S
    assert keeping.expires_at(100.0, 10.0, None) == 110.0 + keeping.RETENTION_S
    assert keeping.to_evict([(3.0, "c", 0), (1.0, "a", 0), (2.0, "b", 0)], keep=1) == ["a", "b"]
    assert keeping.to_evict([(1.0, "a", 0)], keep=5) == []
    # past the bytes an account keeps: the oldest results go, the newest stays even alone over it
    assert keeping.to_evict([(1.0, "a", 6), (2.0, "b", 6), (3.0, "c", 6)], keep=5, max_bytes=12) == ["a"]
    assert keeping.to_evict([(1.0, "a", 6), (2.0, "b", 20)], keep=5, max_bytes=12) == ["a"]


def test_a_result_over_the_cap_is_refused_with_what_to_do():
    assert keeping.result_refusal(10, cap=10) is None
    text = keeping.result_refusal(3 * 2**20, cap=2**20)
    assert "3.0 MiB" in text and "save" in text.lower()


def test_a_runs_history_keeps_its_own_events_and_the_latest_rank_events_within_count_and_bytes():
    history = keeping.History(limit=3, max_bytes=100)
    history.add({"event": "queued"}, 0)
    for i in range(5):
        history.add({"event": "report", "i": i}, 10)
    history.add({"event": "running"}, 0)
    history.add({"event": "output", "i": 5}, 10)
    assert history.events() == [{"event": "queued"}, {"event": "report", "i": 3}, {"event": "report", "i": 4},
                                {"event": "running"}, {"event": "output", "i": 5}]
    assert history.dropped == 3 and len(history) == 5
    history.add({"event": "report", "i": 6}, 95)  # the bytes bound: only the newest fits
    assert history.events() == [{"event": "queued"}, {"event": "running"}, {"event": "report", "i": 6}]
    assert history.dropped == 6


def test_who_may_see_and_cancel():
    assert keeping.may_see("ann", "ann") and not keeping.may_see("ann", "bob")
    assert keeping.may_cancel("ann", "ann", False) and keeping.may_cancel("ann", "bob", True)
    assert not keeping.may_cancel("ann", "bob", False)


def test_run_ids_are_checked():
    assert keeping.run_id_of("a" * 32) == "a" * 32
    for bad in ("x", None, "A" * 32, "../" + "a" * 29):
        with pytest.raises(BadRunMessage, match="run_id"):
            keeping.run_id_of(bad)


def test_a_run_message_carries_its_detach_limit():
    options = options_to_json(validate_run_options(gpus=1))
    fields = dict(name="f", cwd="/", options=options, buffers=0, checkpoint=None, checkpoint_step=None, asking={})
    assert run_request(Message("run", fields, [b"x"])).detach is None
    assert run_request(Message("run", dict(fields, detach={"max_duration": 30}), [b"x"])).detach == 30.0
    with pytest.raises(BadRunMessage, match="detach.max_duration"):
        run_request(Message("run", dict(fields, detach={"max_duration": -1}), [b"x"]))


# ----- the registry -----------------------------------------------------------------------------------
def test_the_registry_drops_ended_runs_after_retention_and_past_the_per_account_count():
    registry = Registry(keeping.DetachPolicy(retention_s=0.05), per_user=1)
    live = registry.add("ann", "live", 1, 1, 60)
    old = registry.add("ann", "old", 1, 1, 60)
    old.finish({"info": {}, "error": None, "values": None}, [], "finished")
    assert {row["name"] for row in registry.rows("ann")} == {"live", "old"}
    assert registry.rows("bob") == []
    deadline = time.monotonic() + 5
    while registry.get(old.run_id) is not None:
        assert time.monotonic() < deadline, "the ended run was never dropped"
        time.sleep(0.01)
    assert registry.get(live.run_id) is live  # a live run stays
    newer, newest = registry.add("ann", "a", 1, 1, 60), registry.add("ann", "b", 1, 1, 60)
    newer.finish({"info": {}, "error": None, "values": None}, [], "finished")
    newest.finish({"info": {}, "error": None, "values": None}, [], "cancelled")
    assert registry.get(newer.run_id) is None and registry.get(newest.run_id).state == "cancelled"


def test_an_account_at_its_live_runs_limit_is_refused_a_new_one_and_nothing_is_kept():
    registry = Registry(live_per_user=2)
    first, second = registry.add("ann", "a", 1, 1, 60), registry.add("ann", "b", 1, 1, 60)
    with pytest.raises(errors.QuotaExceeded,
                       match=r"at most 2 detached runs of one account that have not ended, and ann has 2.*cancel one"):
        registry.add("ann", "c", 1, 1, 60)
    assert sorted(row["name"] for row in registry.rows("ann")) == ["a", "b"]
    registry.add("bob", "c", 1, 1, 60)  # another account's runs do not count
    first.finish({"info": {}, "error": None, "values": None}, [], "finished")
    third = registry.add("ann", "c", 1, 1, 60)  # an ended run (kept for attach) no longer counts
    assert [registry.get(r.run_id) for r in (first, second, third)] == [first, second, third]


def test_a_run_past_its_limit_raises_run_timeout_at_its_poll_and_a_cancel_raises_its_error():
    registry = Registry()
    run = registry.add("ann", "f", 1, 1, 10)
    run.check(run.started_at + 9)
    with pytest.raises(errors.RunTimeout, match="max_duration of 10 s"):
        run.check(run.started_at + 10)
    assert run.stopping.is_set()
    other = registry.add("ann", "g", 1, 1, 10)
    other.request_stop(errors.RunCancelled("by its owner"))
    with pytest.raises(errors.RunCancelled):
        other.check(other.started_at)


def test_states_follow_the_events_and_a_finished_run_whose_result_was_refused_is_failed():
    run = Registry().add("ann", "f", 1, 1, 10)
    for event, state in (("queued", "queued"), ("granted", "starting"), ("running", "running"),
                         ("output", "running")):
        run.publish({"event": event})
        assert run.state == state
    run.finish({"info": {}, "error": {"type": "ResultTooLarge", "message": "big"}, "values": None}, [], "finished")
    assert run.state == "failed" and run.row()["ended"] is not None


# ----- list, attach, cancel through a real socket (no Ray: these never reach the run path) ------------
class Recorder(Observer):
    def __init__(self):
        self.seen = []

    def requesting(self, gpus, workers): self.seen.append("requesting")
    def granted(self, info): self.seen.append("granted")
    def running(self, info): self.seen.append("running")
    def output(self, rank, stream, text): self.seen.append(("output", text))
    def report(self, metrics, info): self.seen.append(("report", metrics["step"]))
    def released(self, info): self.seen.append("released")


@pytest.fixture
def hosting(monkeypatch):
    registry = Registry()
    folder = tempfile.mkdtemp(prefix="gs-detached-unit-")
    path = os.path.join(folder, "run.sock")
    server = GatewayServer(path, {"run": partial(serve_run, keys=None, registry=registry)}).start()
    monkeypatch.setenv(GATEWAY_ENV, path)
    yield registry
    server.stop()
    os.rmdir(folder)


def _ended_run(registry, user):
    """A detached run that finished: granted, an output, a report, released, a value (None)."""
    run = registry.add(user, "train", 2, 2, 60)
    info = RunInfo(lease_id=3, gpus=2, workers=2)
    run.publish({"event": "granted", "info": info_to_json(info, checkpoint=None)})
    run.publish({"event": "running", "info": info_to_json(info, checkpoint=None)})
    run.publish({"event": "output", "rank": 0, "stream": "stdout", "text": "epoch 1\n"})
    info.history.append({"step": 1})
    run.publish({"event": "report", "metrics": {"step": 1}, "info": info_to_json(info, checkpoint=None)})
    info.released, info.end_reason = True, "finished"
    run.publish({"event": "released", "info": info_to_json(info, checkpoint=None)})
    run.finish({"info": info_to_json(info, checkpoint=None), "error": None,
                "values": {"all": False, "items": [None]}}, [], "finished")
    return run


def test_list_shows_only_the_callers_runs(hosting):
    mine, theirs = _ended_run(hosting, ME), _ended_run(hosting, "someone-else")
    records = gs.runs(all=True)
    assert [r.run_id for r in records] == [mine.run_id]
    assert records[0].state == "finished" and records[0].gpus == 2 and records[0].expires > records[0].ended


def test_attach_replays_history_output_and_the_end(hosting):
    from gpusession.observe import events

    recorder = Recorder()
    events.set_observer_factory(lambda workers: recorder)
    try:
        run = gs.attach(_ended_run(hosting, ME).run_id)
        assert run.result(timeout=10) is None
    finally:
        events.set_observer_factory(None)
    assert run.state is gs.RunStatus.FINISHED and run.metrics == [{"step": 1}]
    assert recorder.seen[:3] == ["requesting", "granted", "running"]
    assert ("output", "epoch 1\n") in recorder.seen and ("report", 1) in recorder.seen
    assert run.info.end_reason == "finished" and run.info.released


def test_a_detached_runs_kept_history_stops_growing_at_its_cap_and_attach_replays_the_latest(hosting):
    from gpusession.observe import events

    run = hosting.add(ME, "chatty", 1, 1, 60)
    info = RunInfo(lease_id=3, gpus=1, workers=1)
    run.publish({"event": "granted", "info": info_to_json(info, checkpoint=None)})
    run.publish({"event": "running", "info": info_to_json(info, checkpoint=None)})
    blob = "x" * 2**20  # a MiB of metrics per report: the cap is bytes before it is count
    kept_after = []
    for step in range(1, 201):
        info.history.append({"step": step})
        run.publish({"event": "report", "metrics": {"step": step, "blob": blob},
                     "info": info_to_json(info, checkpoint=None)})
        kept_after.append(len(run.history))
    kept = kept_after[-1]
    assert kept_after[100:] == [kept] * 100 and 2 + 50 < kept < 2 + 64  # grew to the cap, then no more
    run.finish({"info": info_to_json(info, checkpoint=None), "error": None,
                "values": {"all": False, "items": [None]}}, [], "finished")
    record = gs.runs(all=True)[0]
    assert record.reports == 200 and record.dropped == 200 - (kept - 2)

    recorder = Recorder()
    events.set_observer_factory(lambda workers: recorder)
    try:
        attached = gs.attach(run.run_id)
        assert attached.result(timeout=30) is None
    finally:
        events.set_observer_factory(None)
    assert recorder.seen[:3] == ["requesting", "granted", "running"]  # the run's own events stay
    steps = [seen[1] for seen in recorder.seen if seen[0] == "report"]
    assert steps == list(range(200 - (kept - 2) + 1, 201))  # the latest reports, in order
    assert [m["step"] for m in attached.metrics] == steps


def test_another_accounts_run_cannot_be_attached_or_cancelled(hosting):
    theirs = hosting.add("someone-else", "train", 1, 1, 60)
    with pytest.raises(errors.GPUSessionError, match="keeps no detached run"):
        gs.attach(theirs.run_id)
    from gpusession.gateway.reattach import cancel_run

    with pytest.raises(errors.GPUSessionError, match="keeps no detached run"):
        cancel_run(theirs.run_id)
    assert theirs.stop_error is None
    mine = hosting.add(ME, "train", 1, 1, 60)
    assert cancel_run(mine.run_id) is True
    with pytest.raises(errors.RunCancelled, match="cancelled by its owner"):
        mine.check(time.time())


def test_a_malformed_run_id_is_refused_by_name(hosting):
    with pytest.raises(errors.GPUSessionError, match="run_id"):
        gs.attach("../etc")


def test_a_detach_past_the_accounts_live_runs_limit_fails_at_once_with_quota_exceeded(hosting):
    hosting.live_per_user = 1
    hosting.add(ME, "running", 1, 1, 60)

    @gs.distributed(gpus=1)
    def f():
        return 1

    run = f.submit(detach=True, max_duration=60)
    with pytest.raises(gs.QuotaExceeded,
                       match=r"at most 1 detached runs of one account that have not ended, and .* has 1; nothing was started"):
        run.result(timeout=30)
    assert run.state is gs.RunStatus.FAILED and run.run_id is None
    assert [row["name"] for row in hosting.rows(ME)] == ["running"]


def test_detach_with_the_embedded_cluster_is_refused_and_says_where_it_works(monkeypatch, tmp_path):
    monkeypatch.delenv(GATEWAY_ENV, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no cluster to join: the embedded one, inside the kernel
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))

    @gs.distributed(gpus=1)
    def f():
        return 1

    with pytest.raises(errors.GPUSessionError, match="none to join .* embedded cluster, a Ray head inside the kernel"):
        f.submit(detach=True)
    with pytest.raises(TypeError, match="detach=True"):
        f.submit(max_duration=10)
    assert gs.runs(all=True) == []  # nothing is kept anywhere
    with pytest.raises(errors.GPUSessionError, match="embedded cluster"):
        gs.attach("a" * 32)


def test_with_a_cluster_but_no_gateway_of_the_user_there_is_nothing_to_list_or_attach(monkeypatch, tmp_path):
    from gpusession.gateway.reattach import cancel_run

    monkeypatch.delenv(GATEWAY_ENV, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # `gpusession lab`'s kernels have one; no gateway ran for it
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    assert gs.runs(all=True) == []
    for call in (lambda: gs.attach("a" * 32), lambda: cancel_run("a" * 32)):
        with pytest.raises(errors.GPUSessionError, match="no detached run of yours is kept on the cluster at "
                                                         "127.0.0.1:1: your gateway .* is not running"):
            call()
    assert not (tmp_path / "gateways").exists(), "listing or attaching started or made something"


def test_detach_with_an_infinite_limit_is_refused(monkeypatch):
    monkeypatch.setenv(GATEWAY_ENV, "/nonexistent/run.sock")

    @gs.distributed(gpus=1)
    def f():
        return 1

    with pytest.raises(ValueError, match="finite"):
        f.submit(detach=True, max_duration=math.inf)


def test_an_admin_may_cancel_another_accounts_run_but_not_attach_to_it(monkeypatch):
    from gpusession.gateway.reattach import cancel_run

    registry = Registry()
    folder = tempfile.mkdtemp(prefix="gs-detached-admin-")
    path = os.path.join(folder, "run.sock")
    server = GatewayServer(path, {"run": partial(serve_run, keys=None, registry=registry)},
                           admins=frozenset({ME})).start()
    monkeypatch.setenv(GATEWAY_ENV, path)
    try:
        theirs = registry.add("someone-else", "train", 1, 1, 60)
        with pytest.raises(errors.GPUSessionError, match="keeps no detached run"):
            gs.attach(theirs.run_id)
        assert cancel_run(theirs.run_id) is True
        with pytest.raises(errors.RunCancelled, match=f"the admin {ME}"):
            theirs.check(time.time())
    finally:
        server.stop()
        os.rmdir(folder)


@pytest.fixture
def serving(monkeypatch):
    """A real gateway socket whose registry the test fills; `serving(admins)` starts it and points
    GPUSESSION_GATEWAY at it, as the hub sets it in its terminals."""
    started = []

    def serve(admins=frozenset()):
        registry = Registry()
        folder = tempfile.mkdtemp(prefix="gs-detached-list-")
        server = GatewayServer(os.path.join(folder, "run.sock"), {"run": partial(serve_run, keys=None, registry=registry)},
                               admins=frozenset(admins)).start()
        started.append((server, folder))
        monkeypatch.setenv(GATEWAY_ENV, str(server.path))
        return registry

    yield serve
    for server, folder in started:
        server.stop()
        os.rmdir(folder)


def test_an_admin_lists_every_accounts_runs_from_the_shell_and_cancels_another_users_by_its_id(serving, capsys):
    from gpusession.cli.main import main as gpusession

    registry = serving(admins={ME})
    theirs = registry.add("someone-else", "train", 2, 2, 60)
    mine = registry.add(ME, "sweep-3", 1, 1, 60)
    assert gpusession(["runs", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run_id", "user", "name", "state", "gpus", "started", "ended", "end_reason", "expires"]
    assert [line.split()[:3] for line in lines[1:]] == [[mine.run_id, ME, "sweep-3"]]  # without the flag: mine
    assert gpusession(["runs", "list", "--every-user", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["run_id"], row["user"], row["gpus"]) for row in rows] == [(mine.run_id, ME, 1), (theirs.run_id, "someone-else", 2)]
    assert gpusession(["runs", "cancel", theirs.run_id]) == 0
    assert capsys.readouterr().out == f"detached run {theirs.run_id}: cancelling (every worker stops and its GPUs are released)\n"
    with pytest.raises(errors.RunCancelled, match=f"cancelled by the admin {ME}"):
        theirs.check(time.time())


def test_every_accounts_runs_are_refused_to_a_user_who_is_not_an_admin_and_to_a_malformed_ask(serving, capsys):
    from gpusession.cli.main import main as gpusession
    from gpusession.gateway.client import connect
    from gpusession.gateway.kinds import Kind

    registry = serving()
    theirs = registry.add("someone-else", "train", 2, 2, 60)
    assert gpusession(["runs", "list", "--every-user"]) == 1
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith(
        f"gpusession: Only an admin of the gateway lists every account's detached runs, and {ME} is not one"), said.err
    assert "gpusession runs list` shows your own" in said.err
    assert gpusession(["runs", "list"]) == 0 and capsys.readouterr().out == "(none)\n"  # theirs is not shown
    assert gpusession(["runs", "cancel", theirs.run_id]) == 1
    assert "keeps no detached run" in capsys.readouterr().err
    theirs.check(time.time())  # still going: neither the list nor the cancel touched it
    conn, _ = connect("run")
    try:
        conn.send(Kind.LIST, every_user="yes")
        answer = conn.receive()
    finally:
        conn.close()
    assert answer.kind == Kind.FAILED and answer.get("error") == {
        "type": "InvalidRequest", "message": "The gateway refused the request: every_user must be true or false; got str."}


def test_every_user_without_the_hubs_gateway_says_where_to_run_it(monkeypatch, capsys):
    from gpusession.cli.main import main as gpusession

    monkeypatch.delenv(GATEWAY_ENV, raising=False)
    assert gpusession(["runs", "list", "--every-user"]) == 1
    assert capsys.readouterr().err == (
        "gpusession: --every-user asks the hub's gateway, and this shell reaches none (GPUSESSION_GATEWAY is unset; the "
        "hub sets it in its terminals and kernels). Run it in a terminal of your Jupyter server on the hub, as one of "
        "the hub's admins.\n")


def test_the_runs_table_shows_times_as_local_clock_times_and_a_dash_for_what_is_not_there():
    from gpusession.cli.runs import table

    started = time.mktime((2026, 11, 30, 18, 5, 9, 0, 0, -1))
    row = {"run_id": "a" * 32, "user": "ann", "name": "train", "state": "running", "gpus": 2.0, "started": started,
           "ended": None, "end_reason": None, "expires": started + 3600, "reports": 4}
    header, line = table([row]).splitlines()
    assert line.split() == ["a" * 32, "ann", "train", "running", "2", "2026-11-30", "18:05:09", "-", "-",
                            "2026-11-30", "19:05:09"]
    assert table([]) == "(none)"


def test_a_run_id_that_is_not_32_hex_digits_is_refused_before_anything_is_asked(capsys):
    from gpusession.cli.main import main as gpusession

    with pytest.raises(SystemExit) as exited:
        gpusession(["runs", "cancel", "../etc"])
    assert exited.value.code == 2
    assert "argument RUN_ID: expected a run id, 32 hexadecimal digits" in capsys.readouterr().err


def test_a_following_kernel_that_stops_reading_is_dropped_and_never_holds_up_the_run():
    import socket

    from gpusession.gateway import detached
    from gpusession.gateway.frames import Connection

    ours, theirs = socket.socketpair()
    try:
        run = Registry().add("ann", "f", 1, 1, 60)
        follower = run.follow(Connection(ours))
        follower.max_pending = 16
        began = time.monotonic()
        for _ in range(200):  # far more than the socket buffers hold; `theirs` never reads
            run.publish({"event": "output", "rank": 0, "stream": "stdout", "text": "x" * 2**16})
        assert time.monotonic() - began < 2.0, "a kernel that reads nothing held up the run"
        assert follower.dropped and run._subscribers == [] and len(run.history) == 200
        assert follower.join(5)
    finally:
        theirs.close()
        ours.close()


def test_a_kernel_attaching_mid_run_is_sent_the_events_so_far_then_the_live_ones_then_the_end():
    import socket

    from gpusession.gateway.chunks import gather
    from gpusession.gateway.frames import Connection

    ours, theirs = socket.socketpair()
    try:
        run = Registry().add("ann", "f", 1, 1, 60)
        run.publish({"event": "output", "rank": 0, "stream": "stdout", "text": "before\n"})
        follower = run.follow(Connection(ours))
        run.publish({"event": "output", "rank": 0, "stream": "stdout", "text": "after\n"})
        run.finish({"info": {}, "error": None, "values": {"all": False, "items": [0]}}, [b"pickle"], "finished")
        assert follower.join(5)
        kernel = Connection(theirs)
        got = [kernel.receive() for _ in range(3)]
        assert [m.get("text") for m in got[:2]] == ["before\n", "after\n"]
        done = gather(kernel, got[2])
        assert done.kind == "done" and done.payload == [b"pickle"]
    finally:
        theirs.close()
        ours.close()


def test_a_detached_run_the_gateway_fails_to_host_still_ends_its_record(monkeypatch):
    from gpusession.gateway import hosted as hosting

    def broken(*args, **kwargs):
        raise RuntimeError("the service's keys are unreadable")

    monkeypatch.setattr(hosting, "identity_of", broken)
    registry = Registry()
    options = options_to_json(validate_run_options(gpus=1))
    request = run_request(Message("run", dict(name="f", cwd="/", options=options, buffers=0, checkpoint=None,
                                              checkpoint_step=None, asking={}, detach={"max_duration": 60}), [b"x"]))

    class Gone:
        def send(self, *args, **kwargs):
            raise OSError("gone")

    with pytest.raises(RuntimeError):
        hosting._run(Gone(), type("Caller", (), {"user": ME, "admin": False})(), request, None, None, registry,
                     CallBytes().intake(ME).share([b"x"]))
    (row,) = registry.rows(ME)
    assert row["state"] == "failed" and row["ended"] is not None
