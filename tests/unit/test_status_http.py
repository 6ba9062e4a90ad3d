"""The broker's status endpoint without Ray: request parsing, and the CLI's client against a real
endpoint whose answer checks identities the way the broker does (authz.caller)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from gpusession.cli import access as cli_access
from gpusession.broker.http import status_endpoint
from gpusession.broker.service import authz
from gpusession.broker.http.status_http import BadRequest, StatusEndpoint, parse_head
from gpusession.errors import NotAuthorized
from gpusession.identity import sign

KEY = b"identity-key"


def test_a_status_request_carries_its_token_user_and_signature():
    query = parse_head(b"GET /status?user=al%C3%AFce&signature=abc HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: token s3cret\r\n\r\n")
    assert query.token == "s3cret" and query.auth == {"user": "al\u00efce", "signature": "abc"}


@pytest.mark.parametrize("head", [b"POST /status HTTP/1.1\r\n\r\n", b"GET /leases HTTP/1.1\r\n\r\n",
                                  b"garbage\r\n\r\n", b"GET /status?user=a\r\n\r\n"])
def test_anything_but_get_status_is_refused(head):
    with pytest.raises(BadRequest):
        parse_head(head)


def test_a_request_with_another_scheme_carries_no_token():
    assert parse_head(b"GET /status HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n").token is None


class RunningEndpoint:
    """A StatusEndpoint on its own event loop (a thread), announced in `directory`."""

    def __init__(self, directory, *, require_signed: bool) -> None:
        keys = authz.Keys("admin-token", KEY, require_signed)

        async def answer(auth: dict) -> dict:
            return {"user": authz.caller(auth, keys).user}

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.endpoint = StatusEndpoint(answer)
        opened = self.endpoint.open(db_path=str(directory / "ledger.db"), ray_address="10.0.0.1:6379")
        self.announced = asyncio.run_coroutine_threadsafe(opened, self.loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            self.endpoint.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def signed_cluster(tmp_path):
    running = RunningEndpoint(tmp_path, require_signed=True)
    yield running
    running.stop()


def test_the_cli_finds_the_announced_endpoint_of_its_cluster_only(signed_cluster, tmp_path):
    assert status_endpoint.find("10.0.0.1:6379", home=tmp_path) == signed_cluster.announced
    assert status_endpoint.find("10.0.0.2:6379", home=tmp_path) is None


def test_a_cluster_that_requires_signed_identities_still_requires_them_through_the_endpoint(
        signed_cluster, monkeypatch):
    access = cli_access.EndpointAccess(signed_cluster.announced)
    monkeypatch.setenv("GPUSESSION_USER", "alice")
    monkeypatch.setenv("GPUSESSION_IDENTITY", sign("mallory", KEY))
    with pytest.raises(NotAuthorized, match="not signed by the Jupyter server"):
        access.status()
    monkeypatch.setenv("GPUSESSION_IDENTITY", sign("alice", KEY))
    assert access.status() == {"user": "alice"}


def test_a_stopped_endpoint_removes_its_announcement(tmp_path):
    running = RunningEndpoint(tmp_path, require_signed=False)
    running.stop()
    assert status_endpoint.read(tmp_path / status_endpoint.ANNOUNCE_NAME) is None
