"""Refusals are named errors; a bug is an incident. The broker's door, the bridge and the REST
layer's error mapping, and the fuzz tests' judge (tests/fuzzcheck.py), without Ray or a server:
a bare TypeError injected into a real broker handler becomes BrokerFailed, and the judge the
fuzz tests use calls that a crash while it calls a named refusal a refusal."""
from __future__ import annotations

import asyncio
import inspect

import pytest
from tornado import web

from gpusession import errors
from gpusession.broker.service.admin_api import AdminMethods
from gpusession.broker.service.door import door
from gpusession.errors import BrokerFailed, InvalidRequest, LeaseNotFound, NotAuthorized
from jupyter_ext.bridge import error_type
from jupyter_ext.brokerlink import BrokerUnavailable, _error
from jupyter_ext.httperrors import APIError, http_errors, status_for

from ..fuzzcheck import Crash, judge_broker_error, judge_http


class Handlers:
    @door
    async def refuses(self, lease_id: int, *, auth: dict) -> dict:
        raise LeaseNotFound(f"There is no lease {lease_id}.")

    @door
    async def has_a_type_bug(self, lease_id: int) -> dict:
        return {"id": lease_id + "1"}  # a bare TypeError from inside: a bug, not a refusal

    @door
    async def has_a_value_bug(self) -> int:
        return int("not a number")


def outcome(coroutine) -> BaseException:
    with pytest.raises(BaseException) as raised:
        asyncio.run(coroutine)
    return raised.value


def test_a_named_refusal_passes_the_door_as_itself_and_the_fuzz_judge_calls_it_a_refusal():
    refusal = outcome(Handlers().refuses(7, auth={}))
    assert type(refusal) is LeaseNotFound and "no lease 7" in str(refusal)
    assert judge_broker_error("refuses", (7,), refusal) == "refused"


@pytest.mark.parametrize("method, args", [("has_a_type_bug", (7,)), ("has_a_value_bug", ())])
def test_a_bare_type_or_value_error_inside_a_handler_is_an_incident_and_fails_the_fuzz_judge(method, args, caplog):
    failure = outcome(getattr(Handlers(), method)(*args))
    assert type(failure) is BrokerFailed and "incident" in str(failure)
    incident = str(failure).split("incident ")[1][:8]
    assert any(incident in record.getMessage() and record.exc_info for record in caplog.records)
    assert "Traceback" not in str(failure) and ".py" not in str(failure)  # no paths reach the caller
    with pytest.raises(Crash, match=f"{method}.*crashed instead of refusing: BrokerFailed"):
        judge_broker_error(method, args, failure)


def test_a_bare_type_error_injected_into_a_real_broker_handler_fails_the_fuzz_judge():
    """AdminMethods.timings as the broker actor runs it, with its admin check raising a bare TypeError."""

    class Broker(AdminMethods):
        def _require_admin(self, auth):
            raise TypeError("'NoneType' object is not subscriptable")

    failure = outcome(Broker().timings({"token": "t"}))
    assert isinstance(failure, BrokerFailed)
    with pytest.raises(Crash):
        judge_broker_error("timings", ({"token": "t"},), failure)


def test_the_fuzz_judge_calls_a_bare_type_error_that_escaped_a_crash_too():
    with pytest.raises(Crash, match="TypeError"):
        judge_broker_error("quota", ([],), TypeError("unhashable type: 'list'"))
    with pytest.raises(Crash, match="empty"):
        judge_broker_error("quota", ([],), InvalidRequest(""))


def test_a_call_with_arguments_the_method_does_not_take_is_refused_as_invalid_request_naming_them():
    refusal = outcome(Handlers().refuses(7, 8, auth={}))
    assert type(refusal) is InvalidRequest and "refuses was called with arguments it does not take" in str(refusal)
    assert "it takes (lease_id, *, auth)" in str(refusal)
    assert judge_broker_error("refuses", (7, 8), refusal) == "refused"


def test_every_broker_method_is_behind_the_door():
    from gpusession.broker.service.service import BrokerService

    public = {name: fn for name, fn in inspect.getmembers(BrokerService, inspect.iscoroutinefunction)
              if not name.startswith("_")}
    assert len(public) >= 24, sorted(public)
    undoored = sorted(name for name, fn in public.items() if not hasattr(fn, "__wrapped__"))
    assert undoored == [], f"broker methods without @door (their bugs would reach callers as refusals): {undoored}"


def test_every_named_error_has_a_one_line_docstring_and_crosses_the_bridge_by_name():
    for name, kind in errors.ERRORS_BY_NAME.items():
        assert kind.__doc__ and "\n" not in kind.__doc__.strip(), name
        assert error_type(kind("x")) == name
        assert type(_error({"type": name, "message": "x"})) is kind


@pytest.mark.parametrize("bug", [TypeError("unsupported operand"), ValueError("invalid literal"), KeyError("user"),
                                 LookupError("The bridge does not offer 'x'")])
def test_a_bug_in_the_bridge_reaches_the_server_as_broker_failed_not_a_refusal(bug):
    assert error_type(bug) == "BrokerFailed"
    assert type(_error({"type": "BrokerFailed", "message": "incident 1a2b3c4d"})) is BrokerFailed


def test_an_unreachable_broker_is_unavailable_not_a_bug():
    assert error_type(ConnectionError("refused")) == "Unavailable"
    assert type(_error({"type": "Unavailable", "message": "gone"})) is BrokerUnavailable


@pytest.mark.parametrize("error, status", [
    (NotAuthorized("no"), 403), (LeaseNotFound("gone"), 404), (InvalidRequest("max_gpus must be"), 400),
    (errors.Infeasible("8 > 4"), 409), (errors.QuotaExceeded("spent"), 409), (BrokerUnavailable("starting"), 503),
    (BrokerFailed("incident 1a2b3c4d"), 500),
    (ValueError("bug"), None), (TypeError("bug"), None), (RuntimeError("bug"), None),
])
def test_named_errors_map_to_http_statuses_and_bare_ones_to_none(error, status):
    assert status_for(error) == status


def test_a_refusal_is_a_4xx_with_its_message_and_a_bare_type_error_a_500_with_an_incident_id(caplog):
    with pytest.raises(APIError) as refusal, http_errors():
        raise InvalidRequest("gpu_hours must be a number >= 0; 100% sure")
    assert refusal.value.status_code == 400 and refusal.value.message.startswith("gpu_hours")
    assert judge_http(400, {"message": refusal.value.message}, "PUT api/quotas/bob") == "refused"
    with pytest.raises(APIError) as crash, http_errors():
        raise TypeError("'int' object is not iterable")
    incident = crash.value.details["incident"]
    assert crash.value.status_code == 500 and f"incident {incident}" in crash.value.message
    assert "iterable" not in crash.value.message  # the bug's text stays in the server's log
    assert any(incident in record.getMessage() and record.exc_info for record in caplog.records)
    with pytest.raises(Crash, match="answered 500"):
        judge_http(500, {"message": crash.value.message, **crash.value.details}, "GET api/leases")


def test_the_http_judge_wants_a_message_with_every_refusal_and_no_5xx():
    assert judge_http(200, None, "GET api/cluster") == "answered"
    assert judge_http(405, None, "PUT api/cluster") == "refused"
    with pytest.raises(Crash, match="without a message"):
        judge_http(400, {}, "GET api/usage")
    with pytest.raises(Crash):
        judge_http(503, {"message": "starting"}, "GET api/cluster")


def test_tornado_http_errors_pass_the_error_mapping_as_they_are():
    with pytest.raises(web.HTTPError) as raised, http_errors():
        raise web.HTTPError(403, "no")
    assert raised.value.status_code == 403 and not isinstance(raised.value, APIError)


@pytest.mark.parametrize("given", [None, "", [1], 7, {"a": 1}, "ü" * 24, "wrong"])
def test_an_admin_token_that_is_not_the_token_is_no_match_whatever_its_type(given):
    """Found by the broker fuzz: a list as the token made hmac raise TypeError inside the broker."""
    from gpusession.broker.storage.secrets import token_matches

    assert token_matches(given, "s3cret-token") is False
    assert token_matches("s3cret-token", "s3cret-token") is True
