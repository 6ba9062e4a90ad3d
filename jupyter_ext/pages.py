"""The admin page ({base_url}gpusession/admin) and the Prometheus endpoint ({base_url}gpusession/metrics)."""
from __future__ import annotations

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerJinjaMixin, ExtensionHandlerMixin
from jupyter_server.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST
from tornado import web

from . import metrics
from .handlers import Caller, GPUSessionHandler
from .httperrors import http_errors

try:
    from jupyter_server.auth.decorator import allow_unauthenticated
except ImportError:  # jupyter_server < 2.13 lets handlers decide by themselves
    def allow_unauthenticated(method):
        return method


class AdminPageHandler(Caller, ExtensionHandlerJinjaMixin, ExtensionHandlerMixin, JupyterHandler):
    @web.authenticated
    async def get(self):
        if not self.is_admin:
            admins = ", ".join(sorted(self.extensionapp.options.admin_users)) or "nobody yet"
            raise web.HTTPError(403, "The GPU admin page is for gpusession admins (%s); you are %s. An admin of "
                                "this server can add you to c.GPUSession.admin_users.", admins, self.gs_user)
        self.finish(self.render_template(
            "admin.html", api_url=url_path_join(self.base_url, self.name, "api"), user=self.gs_user,
            xsrf=self.xsrf_token.decode(), lab_url=url_path_join(self.base_url, "lab"),
            static=self.static_url, page_title="GPU sessions",
        ))


class MetricsHandler(GPUSessionHandler):
    @allow_unauthenticated
    async def get(self):
        if not self.current_user and not self.extensionapp.options.metrics_public:
            raise web.HTTPError(403, "Log in to Jupyter to read metrics, or set c.GPUSession.metrics_public = True.")
        with http_errors():
            cluster = await self.call("cluster")
            auth = await self.backend.server_auth()  # ledger-wide figures need the admin token
            stats = await self.call("stats", auth, list(metrics.WAIT_BOUNDS)) if auth else None
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        per_user = self.extensionapp.options.metrics_public or (bool(self.current_user) and self.is_admin)
        self.finish(metrics.render(cluster, stats, per_user=per_user))
