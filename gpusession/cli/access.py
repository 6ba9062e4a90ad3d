"""How the CLI reaches the broker: through a gpusession Jupyter server of this user when one runs
on the same cluster (an HTTP request: well under a second), else by joining Ray as a driver
(seconds: Ray's import alone is more than one).

A Jupyter server with gpusession announces itself once its cluster is up, in Jupyter's runtime
directory (per user, written privately like Jupyter's own jpserver-*.json):
`gpusession-<pid>.json` = {"url", "token", "ray_address", "pid"}. The CLI uses it only when its
Ray address is the one the CLI would join (RAY_ADDRESS, else the head recorded by `gpusession
cluster start` or `gpusession lab`), and only without an explicit --admin-token (then the CLI acts
as that token's holder, which only the Ray path can do).

Behind the hub's gateway (GPUSESSION_GATEWAY set: a `gpusession hub` user's terminal) every
command goes through the gateway's broker session instead (GatewayAccess), without Ray.

`gpusession status` has a third way, between the two: the broker's own read-only status endpoint
on the head's loopback (gpusession/broker/http/status_endpoint.py), for a shell on the head with no Jupyter
server running. Where it is absent, dead or refuses the announcement's token, the Ray path answers.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from jupyter_ext.announce import ANNOUNCE_PREFIX, runtime_dir

from ..broker.http import status_endpoint
from ..cluster import where
from ..errors import GPUSessionError, InvalidRequest, LeaseNotFound, NotAuthorized

TIMEOUT_S = 10.0


gpusession_home = where.state_dir  # without importing Ray
target_address = where.target_address  # the cluster the CLI would join


def find_server(address: str | None) -> dict | None:
    """The announcement of a live server of this user on `address`, if any."""
    if not address:
        return None
    try:
        candidates = sorted(runtime_dir().glob(f"{ANNOUNCE_PREFIX}*.json"))
    except OSError:
        return None
    for path in candidates:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("ray_address") == address and _alive(record.get("pid")):
            return record
    return None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


class ServerAccess:
    """The broker's operations through the server's REST API (it acts as this server's owner)."""

    def __init__(self, record: dict) -> None:
        self.base = record["url"].rstrip("/") + "/gpusession/api/"
        self.token = record["token"]

    def status(self) -> dict:
        return self._call("GET", "status")

    def leases(self, include_ended: bool) -> list[dict]:
        return self._call("GET", "leases", all="true" if include_ended else None)

    def revoke(self, lease_id: int) -> dict:
        return self._call("DELETE", f"leases/{lease_id}")

    def quotas(self) -> list[dict]:
        return self._call("GET", "quotas")

    def quota(self, user: str) -> dict:
        return self._call("GET", f"quotas/{urllib.parse.quote(user, safe='')}")

    def set_quota(self, user: str, update: dict) -> dict:
        return self._call("PUT", f"quotas/{urllib.parse.quote(user, safe='')}", body=update)

    def reset_quota(self, user: str) -> dict:
        return self._call("DELETE", f"quotas/{urllib.parse.quote(user, safe='')}")

    def usage(self, since: float | None, until: float | None, by: str) -> list[dict]:
        return self._call("GET", "usage", since=since, until=until, by=by)

    def _call(self, method: str, path: str, *, body: dict | None = None, **query):
        params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        request = urllib.request.Request(self.base + path + (f"?{params}" if params else ""), method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise _error(error.code, _message(error)) from None
        except OSError as exc:
            raise GPUSessionError(f"The Jupyter server at {self.base} did not answer ({exc}).") from None


class GatewayAccess:
    """The broker's operations through the gateway (a `gpusession hub` user's terminal): the
    gateway acts for this account, named by its socket; no Ray, no token."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _call(self, method: str, **args):
        from ..gateway import brokerclient

        return brokerclient.call(method, path=self.path, **args)

    def status(self) -> dict:
        return self._call("status")

    def leases(self, include_ended: bool) -> list[dict]:
        return self._call("leases", include_ended=include_ended)

    def revoke(self, lease_id: int) -> dict:
        return self._call("revoke", lease_id=lease_id)

    def quotas(self) -> list[dict]:
        return self._call("quotas")

    def quota(self, user: str) -> dict:
        return self._call("quota", user=user)

    def set_quota(self, user: str, update: dict) -> dict:
        return self._call("set_quota", user=user, update=update)

    def reset_quota(self, user: str) -> dict:
        return self._call("reset_quota", user=user)

    def usage(self, since: float | None, until: float | None, by: str) -> list[dict]:
        return self._call("usage", since=since, until=until, by=by)


class EndpointGone(Exception):
    """The broker's status endpoint did not answer as announced (the broker died or restarted)."""


class EndpointAccess:
    """`status` through the broker's status endpoint, as the identity the Ray path would send."""

    def __init__(self, endpoint: status_endpoint.Endpoint) -> None:
        self.endpoint = endpoint

    @classmethod
    def find(cls, address: str | None) -> EndpointAccess | None:
        endpoint = status_endpoint.find(address, home=gpusession_home())
        return cls(endpoint) if endpoint else None

    def status(self) -> dict:
        from ..identity import current_identity

        identity = current_identity()
        query = urllib.parse.urlencode({k: v for k, v in (("user", identity.user), ("signature", identity.signature))
                                        if v is not None})
        request = urllib.request.Request(f"{self.endpoint.url}?{query}",
                                         headers={"Authorization": f"token {self.endpoint.token}"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code in (401, 404):  # not the endpoint announced: another process has its port
                raise EndpointGone(error.code) from None
            raise _error(error.code, _message(error)) from None
        except (OSError, ValueError) as exc:
            raise EndpointGone(exc) from None


def _message(error: urllib.error.HTTPError) -> str:
    try:
        return json.loads(error.read()).get("message") or error.reason
    except (ValueError, AttributeError):
        return str(error.reason)


def _error(status: int, message: str) -> Exception:
    if status == 400:
        return InvalidRequest(message)
    if status == 403:
        return NotAuthorized(message)
    if status == 404:
        return LeaseNotFound(message)
    return GPUSessionError(message)


class RayAccess:
    """The broker's operations as a Ray driver (what the CLI did before; needs a second or more)."""

    def __init__(self, admin_token: str | None) -> None:
        from ..broker import client

        self.client, self.handle = client, client.broker()
        self.admin_token = admin_token

    def _auth(self) -> dict:
        from ..identity import current_identity

        identity = current_identity()
        auth = {"user": identity.user, "signature": identity.signature, "token": self.admin_token}
        if not auth["token"]:  # the broker tells its ledger's place to admins only: look beside the default
            auth["token"] = self.client.admin_token_here()
        return auth

    def status(self) -> dict:
        from ..identity import current_identity

        identity = current_identity()
        return self.client.call(self.handle.status, {"user": identity.user, "signature": identity.signature})

    def leases(self, include_ended: bool) -> list[dict]:
        return self.client.call(self.handle.leases, self._auth(), include_ended)

    def revoke(self, lease_id: int) -> dict:
        return self.client.call(self.handle.revoke, lease_id, self._auth())

    def quotas(self) -> list[dict]:
        return self.client.call(self.handle.quotas, self._auth())

    def quota(self, user: str) -> dict:
        return self.client.call(self.handle.quota, user, self._auth())

    def set_quota(self, user: str, update: dict) -> dict:
        return self.client.call(self.handle.set_quota, user, update, self._auth())

    def reset_quota(self, user: str) -> dict:
        return self.client.call(self.handle.reset_quota, user, self._auth())

    def usage(self, since: float | None, until: float | None, by: str) -> list[dict]:
        return self.client.call(self.handle.usage, self._auth(), since, until, by)

