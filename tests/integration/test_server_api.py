"""The REST API under {base_url}gpusession/, served by a real Jupyter server over the session's Ray
cluster and broker: who may do what, 400s naming the field, 403s, Jupyter's XSRF check, and that a
rejected request changes nothing. One server serves the module (threaded_server.py): what a test
changes in it (the metrics setting, a patched call) it changes through monkeypatch, put back after."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from gpusession.broker import client
from gpusession.errors import InvalidRequest, NotAuthorized
from gpusession.identity import Identity
from gpusession.run.caller.lease import Lease
from gpusession.run.caller.options import validate_run_options

from ..fuzzcheck import Crash, judge_http
from .threaded_server import ThreadedJupyterServer

RAY_TOKEN = Path.home() / ".ray" / "auth_token"  # read before the server's environment moves HOME
ADMIN, ALICE, BOB = "ada", "alice", "bob"
XSRF = "5e55a0c0ffee"


class HeaderIdentityProvider(IdentityProvider):
    """Requests name their user in X-Test-User. No token login, so Jupyter's XSRF check applies."""

    def get_user(self, handler):
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else None


@pytest.fixture(scope="module")
def shared_server(cluster, tmp_path_factory):
    """The module's Jupyter server with the gpusession extension, its backend connected."""
    server = ThreadedJupyterServer(Config({
        "ServerApp": {"identity_provider_class": HeaderIdentityProvider, "jpserver_extensions": {"gpusession": True}},
        "GPUSession": {"ray_address": cluster.address, "admin_token": cluster.admin_token, "admin_users": [ADMIN]},
    }), tmp_path_factory.mktemp("jupyter-server"))
    with pytest.MonkeyPatch.context() as environ:
        environ.setenv("RAY_AUTH_TOKEN_PATH", str(RAY_TOKEN))
        app = server.start()
        try:
            app.extension_manager.extension_points["gpusession"].app.backend.connected.result(timeout=120)
            yield server
        finally:
            server.stop()


@pytest.fixture
def gs_app(shared_server):
    return shared_server.app.extension_manager.extension_points["gpusession"].app


@pytest.fixture
def fetch(shared_server):
    """fetch("api/leases", user=..., method=..., body=..., xsrf=True) -> parsed JSON (or the response with raw=True)."""

    def fetch(path, *, user=ALICE, method="GET", body=None, xsrf=True, params=None, raw=False):
        headers = {"X-Test-User": user} if user else {}
        if xsrf:
            headers.update({"X-XSRFToken": XSRF, "Cookie": f"_xsrf={XSRF}"})
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        response = shared_server.fetch("gpusession", *path.split("/"), method=method, body=body, headers=headers,
                                       params=params)
        return response if raw else json.loads(response.body)

    return fetch


def refused(fetch, path, status, **kwargs) -> str:
    """The request fails with `status`; returns the JSON message."""
    with pytest.raises(HTTPClientError) as failure:
        fetch(path, **kwargs)
    assert failure.value.code == status, failure.value.response.body
    return json.loads(failure.value.response.body)["message"]


@pytest.fixture
def hold(cluster):
    """hold(user, gpus) leases GPUs for `user` in this process; released after the test."""
    held = []

    def hold(user, gpus=1):
        lease = Lease(validate_run_options(gpus=gpus), identity=Identity(user)).acquire()
        held.append(lease)
        return lease

    yield hold
    for lease in held:
        lease.release()


def test_detached_runs_are_only_the_servers_owners_and_with_no_gateway_of_theirs_running_none_are_listed(
        fetch, gs_app):
    owner = gs_app.backend.owner
    said = refused(fetch, "api/runs", 403, user=ALICE)
    assert said.startswith(f"Detached runs on this server are {owner}'s; alice sees their own"), said
    refused(fetch, f"api/runs/{'0' * 32}", 403, user=ALICE, method="DELETE")
    assert fetch("api/runs", user=owner) == {"available": True, "runs": []}  # listing starts no gateway
    said = refused(fetch, f"api/runs/{'0' * 32}", 404, user=owner, method="DELETE")
    assert "gateway" in said, said


def test_a_servers_detached_runs_are_asked_of_its_users_own_gateway_for_the_cluster_its_kernels_join(
        fetch, gs_app, cluster, monkeypatch):
    from .test_gateway_runs import start_user_gateway, stop_user_gateways

    home = tempfile.mkdtemp(prefix="gs-api-home-")
    try:
        start_user_gateway(cluster, home)  # as a first detach of the owner's kernels starts it
        monkeypatch.setenv("GPUSESSION_HOME", home)
        owner = gs_app.backend.owner
        assert fetch("api/runs", user=owner) == {"available": True, "runs": []}
        said = refused(fetch, f"api/runs/{'0' * 32}", 404, user=owner, method="DELETE")
        assert said.startswith(f"The gateway keeps no detached run '{'0' * 32}' of {owner}"), said  # it answered
    finally:
        stop_user_gateways(home)
        shutil.rmtree(home, ignore_errors=True)


def test_any_user_sees_cluster_capacity_and_requests_without_a_user_are_refused(fetch, cluster):
    view = fetch("api/cluster", user=BOB)
    assert view["gpus_total"] == 4 and view["logical_gpus"] is cluster.logical
    assert view["gpus_free"] + view["gpus_leased"] == 4
    refused(fetch, "api/cluster", 403, user=None)
    refused(fetch, "api/quotas", 403, user=None)


def test_users_see_their_own_leases_and_admins_see_everyones(fetch, hold):
    mine, theirs = hold(ALICE), hold(BOB, gpus=2)
    assert [l["lease_id"] for l in fetch("api/leases", user=ALICE)] == [mine.lease_id]
    assert [l["lease_id"] for l in fetch("api/leases", user=BOB)] == [theirs.lease_id]
    every = {l["lease_id"]: l for l in fetch("api/leases", user=ADMIN)}
    assert set(every) == {mine.lease_id, theirs.lease_id}
    assert every[theirs.lease_id]["user"] == BOB and every[theirs.lease_id]["gpus"] == 2
    assert every[theirs.lease_id]["state"] in ("granted", "placed") and every[theirs.lease_id]["age_s"] >= 0


def test_whoami_says_who_the_server_takes_the_caller_for_and_whether_they_are_an_admin(fetch):
    assert fetch("api/whoami", user=ALICE) == {"user": ALICE, "admin": False}
    assert fetch("api/whoami", user=ADMIN) == {"user": ADMIN, "admin": True}
    refused(fetch, "api/whoami", 403, user=None)


def test_a_lease_names_its_notebook_and_the_cluster_shows_it_on_its_node(fetch, hold, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "work/train.ipynb")  # what jupyter_server gives its kernels
    lease = hold(ALICE, gpus=2)
    view = next(l for l in fetch("api/status", user=ALICE)["leases"] if l["lease_id"] == lease.lease_id)
    assert view["notebook"] == "work/train.ipynb"
    nodes = fetch("api/cluster", user=BOB)["nodes"]
    assert sum(n["leased"] for n in nodes) >= 2 and all(n["free"] <= n["gpus"] - n["leased"] for n in nodes)


def test_a_runs_live_step_shows_in_its_lease_and_a_bad_step_is_refused(fetch, hold):
    lease = hold(ALICE)
    progress = client.broker().progress
    client.call(progress, lease.lease_id, 340, auth=client.lease_auth(Identity(ALICE)))
    view = next(l for l in fetch("api/status", user=ALICE)["leases"] if l["lease_id"] == lease.lease_id)
    assert view["step"] == 340
    with pytest.raises(InvalidRequest, match="step must be a whole number"):
        client.call(progress, lease.lease_id, -1, auth=client.lease_auth(Identity(ALICE)))
    with pytest.raises(NotAuthorized):
        client.call(progress, lease.lease_id, 341, auth=client.lease_auth(Identity(BOB)))
    assert next(l for l in fetch("api/leases", user=ADMIN) if l["lease_id"] == lease.lease_id)["step"] == 340


def test_revoking_needs_the_owner_or_an_admin_and_the_xsrf_token(fetch, hold):
    lease = hold(ALICE)
    path = f"api/leases/{lease.lease_id}"
    assert "belongs to alice" in refused(fetch, path, 403, user=BOB, method="DELETE")
    refused(fetch, path, 403, user=ADMIN, method="DELETE", xsrf=False)
    assert fetch("api/leases", user=ALICE)[0]["notice"] is None  # neither refusal touched it
    assert fetch(path, user=ALICE, method="DELETE")["notice"]["kind"] == "revoke"


def test_an_admin_revokes_any_lease_and_a_malformed_or_unknown_id_is_a_400_or_404(fetch, hold):
    lease = hold(BOB)
    assert fetch(f"api/leases/{lease.lease_id}", user=ADMIN, method="DELETE")["notice"]["kind"] == "revoke"
    assert "lease id" in refused(fetch, "api/leases/abc", 400, user=ADMIN, method="DELETE")
    assert "no lease 987654" in refused(fetch, "api/leases/987654", 404, user=ADMIN, method="DELETE")


def test_users_read_only_their_own_quota_and_admins_read_all(fetch):
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="PUT", body={"max_gpus": 1})
    assert [q["user"] for q in fetch("api/quotas", user=ALICE)] == [ALICE]
    assert fetch(f"api/quotas/{ALICE}", user=ALICE)["is_default"] is True
    assert "Only an admin" in refused(fetch, f"api/quotas/{BOB}", 403, user=ALICE)
    assert BOB in {q["user"] for q in fetch("api/quotas", user=ADMIN)}
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="DELETE")


def test_an_admin_sets_then_resets_a_quota(fetch):
    update = {"max_gpus": 2, "gpu_hours": 10.5, "max_priority": "high"}
    saved = fetch(f"api/quotas/{BOB}", user=ADMIN, method="PUT", body=update)
    assert {k: saved[k] for k in update} == update and saved["updated_by"] == ADMIN
    assert fetch(f"api/quotas/{BOB}", user=BOB)["max_gpus"] == 2
    assert fetch(f"api/quotas/{BOB}", user=ADMIN, method="DELETE")["is_default"] is True


BAD_QUOTAS = [  # (body, words the message must contain)
    ({"max_gpus": -1}, "max_gpus"), ({"max_gpus": "two"}, "max_gpus"), ({"gpu_hours": -0.5}, "gpu_hours"),
    ({"max_gpus": True}, "max_gpus"), ({"max_priority": "urgent"}, "max_priority"), ({"colour": "red"}, "'colour'"),
    ("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ("", "not valid JSON"),
]


def test_each_kind_of_bad_quota_is_a_400_naming_the_field_and_changes_nothing(fetch):
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="PUT", body={"max_gpus": 3})
    before = fetch(f"api/quotas/{BOB}", user=ADMIN)
    for body, words in BAD_QUOTAS:
        message = refused(fetch, f"api/quotas/{BOB}", 400, user=ADMIN, method="PUT", body=body)
        assert words in message, (body, message)
    assert fetch(f"api/quotas/{BOB}", user=ADMIN) == before
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="DELETE")


def test_a_non_admin_or_a_request_without_xsrf_token_changes_no_quota(fetch):
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="PUT", body={"max_gpus": 3})
    before = fetch(f"api/quotas/{BOB}", user=ADMIN)
    assert "admin token" in refused(fetch, f"api/quotas/{BOB}", 403, user=BOB, method="PUT", body={"max_gpus": 9})
    refused(fetch, f"api/quotas/{BOB}", 403, user=BOB, method="DELETE")
    refused(fetch, f"api/quotas/{BOB}", 403, user=ADMIN, method="PUT", body={"max_gpus": 9}, xsrf=False)
    refused(fetch, f"api/quotas/{BOB}", 403, user=ADMIN, method="DELETE", xsrf=False)
    assert fetch(f"api/quotas/{BOB}", user=ADMIN) == before
    fetch(f"api/quotas/{BOB}", user=ADMIN, method="DELETE")


def test_usage_counts_gpu_seconds_per_user_and_day_users_see_only_theirs(fetch, hold):
    hold(ALICE, gpus=2).release()
    hold(BOB).release()
    assert {r["user"] for r in fetch("api/usage", user=ALICE)} == {ALICE}
    every = {r["user"]: r["gpu_seconds"] for r in fetch("api/usage", user=ADMIN)}
    assert every[ALICE] > 0 and every[BOB] > 0
    days = fetch("api/usage", user=ADMIN, params={"by": "day", "since": "2020-01-01", "until": "2100-01-01T00:00Z"})
    assert {r["user"] for r in days} >= {ALICE, BOB} and all(len(r["day"]) == 10 for r in days)


BAD_USAGE = [  # (query, words the message must contain)
    ({"by": "week"}, "by must be"), ({"since": "yesterday"}, "since must be"), ({"until": "-5"}, "until must be"),
    ({"since": "2024-02-01", "until": "2024-01-01"}, "after until"),
]


def test_bad_usage_parameters_are_400s_naming_the_parameter(fetch):
    for params, words in BAD_USAGE:
        assert words in refused(fetch, "api/usage", 400, params=params), params


def test_the_admin_page_is_for_admins_and_brings_its_own_chart_library(fetch):
    page = fetch("admin", user=ADMIN, raw=True).body.decode()
    assert "chart.umd.min.js" in page and "admin.js" in page and 'data-xsrf="' in page
    assert "cdn" not in page.lower()
    refused_page = pytest.raises(HTTPClientError, fetch, "admin", user=BOB, raw=True)
    assert refused_page.value.code == 403 and b"c.GPUSession.admin_users" in refused_page.value.response.body


def test_metrics_are_prometheus_text_with_per_user_series_for_admins_or_when_public(fetch, gs_app, hold,
                                                                                     monkeypatch):
    hold(ALICE).release()
    text = fetch("metrics", user=BOB, raw=True).body.decode()
    assert "gpusession_gpus_total 4.0" in text and 'gpusession_leases_total{outcome="finished"}' in text
    assert "gpusession_queue_wait_seconds_bucket" in text
    assert "gpusession_gpu_seconds_total" not in text  # bob may not see alice's (or anyone's) usage
    assert 'gpusession_gpu_seconds_total{user="alice"}' in fetch("metrics", user=ADMIN, raw=True).body.decode()
    refused(fetch, "metrics", 403, user=None, raw=True)
    monkeypatch.setattr(gs_app.options, "metrics_public", True)
    public = fetch("metrics", user=None, raw=True).body.decode()
    assert "gpusession_gpus_leased" in public and 'gpusession_gpu_seconds_total{user="alice"}' in public


def test_a_bridge_that_died_is_replaced_by_the_next_request(fetch, gs_app):
    gs_app.backend.link.proc.kill()
    gs_app.backend.link.proc.wait()
    assert fetch("api/cluster", user=BOB)["gpus_total"] == 4
    assert gs_app.backend.link.alive


PATHS = st.sampled_from(["api/leases", "api/leases/{id}", "api/leases/{held}", "api/quotas", "api/quotas/{user}",
                         "api/usage", "api/cluster", "api/status", "api/whoami", "metrics", "admin"])
USERS = st.sampled_from([ALICE, BOB, ADMIN, "x%y", "ü" * 3, "a" * 300])
ODD = st.one_of(st.text(max_size=30), st.sampled_from(["-1", "0", "1e400", "nan", "inf", "9" * 30, "%00", "17",
                                                        "1970-01-01", "9999-12-31T23:59:59Z", "0001-01-01",
                                                        "x" * 3000]))
BODIES = st.one_of(st.none(), st.text(max_size=40), st.just("[" * 500), st.dictionaries(
    st.sampled_from(["max_gpus", "gpu_hours", "max_priority", "evil", "user"]),
    st.one_of(st.none(), st.integers(-5, 10**20), st.floats(allow_nan=True), st.text(max_size=8),
              st.lists(st.integers(), max_size=3)), max_size=3))


@settings(max_examples=60, suppress_health_check=list(HealthCheck))
@given(path=PATHS, method=st.sampled_from(["GET", "PUT", "DELETE", "POST"]), user=USERS, odd=ODD, body=BODIES,
       query=st.dictionaries(st.sampled_from(["since", "until", "by", "all", "evil"]), ODD, max_size=3))
def test_the_rest_api_answers_or_refuses_by_name_never_crashes_or_hangs_and_a_refused_call_changes_nothing(
        fetch, bobs_lease, path, method, user, odd, body, query):
    """Fuzzed paths, methods, users (one holds a lease the others may not touch), bodies (NaN, unknown
    fields, huge) and query values (Hypothesis); tests/fuzzcheck.py judges each answer."""
    held = bobs_lease
    if path == "api/leases/{held}" and method == "DELETE" and user in (BOB, ADMIN):
        user = ALICE  # another user's lease: refused (revokes by the owner and an admin are tested above)
    path = path.format(id=odd.replace("/", "") or "x", user=odd.replace("/", "") or "x", held=held.lease_id)
    before = _books(fetch)
    started = time.monotonic()
    try:
        fetch(path, user=user, method=method, body=None if method == "GET" else (body or ""), params=query or None,
              raw=True)
        status, answer = 200, None
    except HTTPClientError as exc:
        raw = exc.response.body if exc.response else b""
        status = exc.code  # the admin page and metrics answer HTML or text: their message is the page
        answer = _json(raw) if path.startswith("api/") else {"message": raw.decode(errors="replace")}
    outcome = judge_http(status, answer, f"{method} {path} as {user!r}")
    assert time.monotonic() - started < 30, f"{method} {path} took {time.monotonic() - started:.0f} s (bound 30 s)"
    if outcome == "refused":
        assert _books(fetch) == before, f"{method} {path} as {user!r} was refused but changed the books"
    elif method in ("PUT", "DELETE") and "quotas/" in path:  # an admin changed a quota: put it back
        fetch(path, user=ADMIN, method="DELETE", raw=True)
    assert next(l for l in fetch("api/leases", user=ADMIN) if l["lease_id"] == held.lease_id)["notice"] is None


def _books(fetch) -> tuple:
    """Open leases and quotas as an admin sees them, without what the clock moves (GPU-hours held)."""
    leases = sorted((l["lease_id"], l["state"], str(l["notice"])) for l in fetch("api/leases", user=ADMIN))
    quotas = sorted((q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"], q["is_default"])
                    for q in fetch("api/quotas", user=ADMIN))
    return leases, quotas


@pytest.fixture
def bobs_lease(hold):
    """One lease of bob's for the whole fuzz run (Hypothesis runs every example under one fixture)."""
    return hold(BOB)


def _json(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return None


def test_a_bare_type_error_inside_a_handler_is_a_500_with_an_incident_id_and_the_fuzz_judge_fails_on_it(
        fetch, gs_app, monkeypatch):
    async def broken(method, *args):
        raise TypeError("'NoneType' object is not subscriptable")

    monkeypatch.setattr(gs_app.backend, "call", broken)
    with pytest.raises(HTTPClientError) as failure:
        fetch("api/cluster", user=BOB)
    answer = json.loads(failure.value.response.body)
    assert failure.value.code == 500 and f"incident {answer['incident']}" in answer["message"]
    assert "NoneType" not in answer["message"]
    with pytest.raises(Crash, match="answered 500"):
        judge_http(failure.value.code, answer, "GET api/cluster")
