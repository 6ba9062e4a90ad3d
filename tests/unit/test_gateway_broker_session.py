"""The gateway's broker session, its pure parts: what a request may ask, how the service makes
the broker's auth from the socket's caller (never from the request), what a caller is shown."""
from __future__ import annotations

import pytest

from gpusession.errors import InvalidRequest, NotAuthorized
from gpusession.gateway import brokercalls
from gpusession.gateway.acting import ServiceKeys
from gpusession.gateway.brokersession import answer, error_type
from gpusession.gateway.frames import Message
from gpusession.gateway.peer import Peer
from gpusession.gateway.server import Caller
from gpusession.identity import Identity, sign, verify
from jupyter_ext.kernelenv import kernel_environment

KEYS = ServiceKeys(identity_key=b"k" * 64, admin_token="the-admin-token")
BOB = Caller(Peer(pid=10, uid=1001, gid=1001, name="bob"), admin=False)
ADA = Caller(Peer(pid=11, uid=1002, gid=1002, name="ada"), admin=True)


class Broker:
    """A broker stand-in that records what the gateway asked it."""

    def __init__(self, result=None, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, list]] = []
        self.result, self.error = result, error

    def __call__(self, method: str, args: list):
        self.calls.append((method, args))
        if self.error is not None:
            raise self.error
        return self.result


def _call(method, **args) -> Message:
    return Message("call", {"id": 7, "method": method, "args": args})


@pytest.mark.parametrize("fields, says", [
    ({"method": "signing_key"}, "no broker method 'signing_key'"),
    ({"method": "release", "args": {"lease_id": 1}}, "no broker method 'release'"),
    ({"method": "request"}, "no broker method"),
    ({}, "no broker method 'nothing'"),
    ({"method": "leases", "args": [True]}, "'args' of leases must be a JSON object"),
    ({"method": "leases", "args": {"include_ended": "yes"}}, "'include_ended' of leases must be true or false"),
    ({"method": "revoke", "args": {}}, "revoke needs 'lease_id'"),
    ({"method": "revoke", "args": {"lease_id": True}}, "'lease_id' of revoke must be a lease id"),
    ({"method": "revoke", "args": {"lease_id": "3"}}, "'lease_id' of revoke must be a lease id"),
    ({"method": "set_quota", "args": {"user": "bob", "update": [1]}}, "'update' of set_quota must be a JSON object"),
    ({"method": "quota", "args": {"user": ""}}, "'user' of quota must be a user name"),
    ({"method": "usage", "args": {"since": float("nan")}}, "'since' of usage must be null or seconds"),
    ({"method": "stats", "args": {"wait_bounds": list(range(65))}}, "'wait_bounds' of stats must be a list"),
    ({"method": "status", "args": {"auth": {"token": "x"}}}, "takes no credentials"),
    ({"method": "quotas", "args": {"user": "ada", "signature": "s"}}, "takes no credentials"),
    ({"method": "leases", "args": {"limit": 3}}, "leases takes no argument 'limit'; it takes include_ended"),
    ({"method": "quota", "args": {"user": "x" * (brokercalls.MAX_REQUEST_BYTES + 1)}}, "bytes; a broker call is at most"),
])
def test_a_request_the_session_cannot_take_is_refused_naming_the_field(fields, says):
    with pytest.raises(InvalidRequest, match=says.replace("(", r"\(").replace("'", "'")):
        brokercalls.check(fields)


def test_a_broker_call_with_payload_frames_is_refused():
    with pytest.raises(InvalidRequest, match="no payload frames"):
        brokercalls.check({"method": "status"}, payload_frames=1)


def test_defaults_are_filled_in_and_auth_goes_in_the_broker_methods_own_slot():
    assert brokercalls.check({"method": "usage"}).args == {"since": None, "until": None, "by": "user"}
    call = brokercalls.check({"method": "set_quota", "args": {"user": "bob", "update": {"max_gpus": 2}}})
    assert brokercalls.broker_args(call, {"user": "ada"}) == ["bob", {"max_gpus": 2}, {"user": "ada"}]
    revoke = brokercalls.check({"method": "revoke", "args": {"lease_id": 4}})
    assert brokercalls.broker_args(revoke, {"user": "ada"}) == [4, {"user": "ada"}]


def test_the_bridges_positional_form_maps_to_names_without_the_auth_slot():
    assert brokercalls.named("leases", ({"user": "x", "token": "forged"}, True)) == {"include_ended": True}
    assert brokercalls.named("set_quota", ("bob", {"max_gpus": 1}, {})) == {"user": "bob", "update": {"max_gpus": 1}}
    assert brokercalls.named("usage", ({}, 1.0, None, "day")) == {"since": 1.0, "until": None, "by": "day"}
    with pytest.raises(InvalidRequest, match="signing_key"):
        brokercalls.named("signing_key", ({},))


def test_a_user_is_signed_by_the_gateway_and_never_given_the_admin_token():
    broker = Broker(result={"user": "bob"})
    reply = answer(BOB, KEYS, _call("status"), broker)
    assert reply == {"kind": "result", "id": 7, "result": {"user": "bob"}}
    [(method, [auth])] = broker.calls
    assert method == "status" and set(auth) == {"user", "signature"} and auth["user"] == "bob"
    assert verify(Identity("bob", auth["signature"]), KEYS.identity_key)


def test_an_admin_is_given_the_admin_token_by_the_gateway():
    broker = Broker(result={})
    answer(ADA, KEYS, _call("set_quota", user="bob", update={"max_gpus": 1}), broker)
    auth = broker.calls[0][1][2]
    assert verify(Identity("ada", auth.pop("signature")), KEYS.identity_key)
    assert auth == {"user": "ada", "token": "the-admin-token", "by": "ada"}


def test_what_a_request_says_of_its_sender_changes_nothing():
    broker = Broker(result=[])
    message = Message("call", {"id": 1, "method": "leases", "user": "ada", "token": "the-admin-token",
                               "args": {"include_ended": True}})
    answer(BOB, KEYS, message, broker)  # extra top-level fields are ignored; auth is the socket's
    assert broker.calls[0][1][0]["user"] == "bob" and "token" not in broker.calls[0][1][0]


def test_a_refused_request_never_reaches_the_broker_and_its_error_is_typed():
    broker = Broker()
    reply = answer(BOB, KEYS, _call("signing_key"), broker)
    assert reply["kind"] == "error" and reply["type"] == "InvalidRequest" and reply["id"] == 7
    assert broker.calls == []


def test_the_brokers_typed_errors_reach_the_caller_by_name_and_bugs_get_an_incident():
    assert answer(BOB, KEYS, _call("revoke", lease_id=3), Broker(error=NotAuthorized("not yours")))["type"] == "NotAuthorized"
    failed = answer(BOB, KEYS, _call("cluster"), Broker(error=KeyError("x")))
    assert failed["type"] == "BrokerFailed" and "incident" in failed["message"]
    assert error_type(ConnectionError()) == "Unavailable"


def test_info_is_shown_without_where_the_ledger_lives():
    broker = Broker(result={"version": "1", "protocol": 3, "ledger_id": "L", "policy": {}, "db_path": "/x/ledger.db",
                            "pid": 5})
    shown = answer(ADA, KEYS, _call("info"), broker)["result"]
    assert shown == {"version": "1", "protocol": 3, "ledger_id": "L", "policy": {}}


def test_whoami_is_answered_from_the_socket_without_the_broker():
    broker = Broker()
    assert answer(ADA, KEYS, _call("whoami"), broker)["result"] == {"user": "ada", "admin": True}
    assert broker.calls == []


def test_a_kernel_behind_a_gateway_inherits_no_ray_variable_and_no_admin_token():
    base = {"RAY_ADDRESS": "1.2.3.4:6379", "RAY_AUTH_TOKEN": "t", "GPUSESSION_ADMIN_TOKEN": "a", "HOME": "/home/bob"}
    env = kernel_environment(base, {"GPUSESSION_GATEWAY": "/g.sock"})
    assert env == {"HOME": "/home/bob", "GPUSESSION_GATEWAY": "/g.sock"}
    assert kernel_environment(base, {})["RAY_ADDRESS"] == "1.2.3.4:6379"  # without one, as before


def test_a_hello_is_refused_for_a_nameless_uid_an_unknown_session_and_a_crowded_uid_at_its_accept():
    from gpusession.gateway.server import MAX_CONNECTIONS_PER_UID, crowding, refusal

    sessions = {"broker": None, "run": None}
    assert refusal(BOB.peer, "broker", sessions) is None
    assert "no account name" in refusal(Peer(1, 4242, 4242, ""), "broker", sessions)
    assert "unknown session 'admin'; the gateway offers broker, run" in refusal(BOB.peer, "admin", sessions)
    assert crowding(1001, MAX_CONNECTIONS_PER_UID - 1) is None
    assert "uid 1001 has 64 connections to the gateway open already (at most 64)" in crowding(1001, MAX_CONNECTIONS_PER_UID)


def test_a_process_behind_the_gateway_starts_no_ray_cluster_of_its_own():
    from gpusession.cluster.raycluster import gateway_refusal

    assert "through the gateway at /g.sock" in gateway_refusal({"GPUSESSION_GATEWAY": "/g.sock"})
    assert gateway_refusal({}) is None


def test_the_gateway_offers_the_broker_and_run_sessions_with_the_service_keys(monkeypatch):
    import sys
    import types

    from gpusession.gateway.main import sessions_for

    seen = []
    fake = types.ModuleType("gpusession.gateway.hosted")
    fake.serve_run = lambda conn, caller, hello, keys: seen.append((caller, keys))
    monkeypatch.setitem(sys.modules, "gpusession.gateway.hosted", fake)
    sessions = sessions_for(KEYS, call=Broker())
    sessions["run"](None, BOB, Message("hello"))
    assert sorted(sessions) == ["broker", "run"] and seen == [(BOB, KEYS)]
