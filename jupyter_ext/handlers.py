"""The REST API under {base_url}gpusession/api/: parse, call the broker as the caller, write JSON.

Who the caller is: the user name of the server's identity provider (JupyterHub's, or one you
configured). jupyter_server's own token/password login names no users (it makes up an anonymous
name per browser), so there every request acts as the server's owner.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from http.client import responses

from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from . import params
from .httperrors import APIError, http_errors


class Caller:
    """Who asks (see the module docstring), for API handlers and the admin page alike."""

    @property
    def backend(self):
        return self.extensionapp.backend

    @property
    def gs_user(self) -> str:
        if type(self.identity_provider).__module__.startswith("jupyter_server."):
            return self.backend.owner
        return self.current_user.username

    @property
    def is_admin(self) -> bool:
        return self.gs_user in self.extensionapp.options.admin_users

    async def auth(self) -> dict:
        return await self.backend.auth_for(self.gs_user)


class GPUSessionHandler(Caller, ExtensionHandlerMixin, APIHandler):
    async def call(self, method: str, *args):
        return await self.backend.call(method, *args)

    def write_error(self, status_code: int, **kwargs) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if not isinstance(error, APIError):
            return super().write_error(status_code, **kwargs)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": error.message, "reason": responses.get(status_code), **error.details}))


def api(method):
    """Authenticated JSON endpoint: mapped domain errors become statuses, the result the body."""

    @web.authenticated
    @functools.wraps(method)
    async def endpoint(self, *args):
        with http_errors():
            result = await method(self, *args)
        self.finish(json.dumps(result))

    return endpoint


class ClusterHandler(GPUSessionHandler):
    @api
    async def get(self):
        return await self.call("cluster")


class WhoAmIHandler(GPUSessionHandler):
    """Who the server takes the caller for, and whether they are a gpusession admin: JupyterLab's
    extension offers the admin panel only to admins (the admin routes refuse others anyway)."""

    @api
    async def get(self):
        return {"user": self.gs_user, "admin": self.is_admin}


class StatusHandler(GPUSessionHandler):
    """What gs.status() returns, for the caller: the cluster, their quota, their leases."""

    @api
    async def get(self):
        return await self.call("status", await self.auth())


class LeasesHandler(GPUSessionHandler):
    @api
    async def get(self):
        include_ended = params.flag("all", self.get_query_argument("all", None))
        return await self.call("leases", await self.auth(), include_ended)


class LeaseHandler(GPUSessionHandler):
    @api
    async def delete(self, lease_id: str):
        return await self.call("revoke", params.lease_id(lease_id), await self.auth())


class QuotasHandler(GPUSessionHandler):
    @api
    async def get(self):
        return await self.call("quotas", await self.auth())


class QuotaHandler(GPUSessionHandler):
    @api
    async def get(self, user: str):
        return await self.call("quota", user, await self.auth())

    @api
    async def put(self, user: str):
        return await self.call("set_quota", user, params.json_object(self.request.body), await self.auth())

    @api
    async def delete(self, user: str):
        return await self.call("reset_quota", user, await self.auth())


class UsageHandler(GPUSessionHandler):
    @api
    async def get(self):
        since, until, by = params.usage_query(self.get_query_argument)
        return await self.call("usage", await self.auth(), since, until, by)



class OwnerOnly(GPUSessionHandler):
    """Routes that act through the server's own account (its gateway connection): for the
    server's owner only, as a server that names other users must not show them its owner's runs."""

    def owner_only(self) -> None:
        if self.gs_user != self.backend.owner:
            raise APIError(403, f"Detached runs on this server are {self.backend.owner}'s; {self.gs_user} sees "
                                "their own in their own server.")

    async def kernels_cluster(self) -> str | None:
        """The cluster this server's kernels join (their RAY_ADDRESS), where their detached runs'
        gateway is found; None behind the hub's gateway, or while the cluster is not up."""
        try:
            conn = await self.backend.connection(wait_s=5.0)
        except Exception:  # not up yet: the gateway (if any) is looked for as this process would
            return None
        return conn.ray_env.get("RAY_ADDRESS")


class DetachedRunsHandler(OwnerOnly):
    """The server owner's detached runs (gs.runs(all=True)), through the gateway that hosts them:
    {"available": true, "runs": [...]} or, where no gateway hosts detached runs, {"available":
    false, "message": why, "runs": []}. The server asks as the account it runs as, so only that
    account's runs are listed (the gateway checks it by the socket's peer)."""

    @api
    async def get(self):
        from gpusession.errors import GPUSessionError
        from gpusession.gateway import reattach

        self.owner_only()
        try:
            address = await self.kernels_cluster()
            records = await asyncio.get_running_loop().run_in_executor(None, reattach.list_runs, address)
        except GPUSessionError as exc:
            return {"available": False, "message": str(exc), "runs": []}
        return {"available": True, "runs": [dataclasses.asdict(record) for record in records]}


class DetachedRunHandler(OwnerOnly):
    @api
    async def delete(self, run_id: str):
        """Stop one detached run of the server owner's: {"run_id", "ended": whether it had ended already}."""
        from gpusession.errors import GPUSessionError, InvalidRequest
        from gpusession.gateway import reattach

        self.owner_only()
        try:
            address = await self.kernels_cluster()
            stopping = await asyncio.get_running_loop().run_in_executor(None, reattach.cancel_run, run_id, address)
        except InvalidRequest:
            raise
        except GPUSessionError as exc:  # no such run of theirs (or no gateway): nothing changed
            raise APIError(404, str(exc)) from exc
        return {"run_id": run_id, "ended": not stopping}
