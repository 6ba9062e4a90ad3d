"""The Jupyter server extension `gpusession`: enabled by `pip install`, configured as c.GPUSession.

At load it starts bringing up the cluster (an embedded `ray start` head for ray_address "local")
and the bridge to the broker, puts the cluster and a signed user into every new kernel's
environment, and serves the REST API, the admin page and metrics under {base_url}gpusession/.
At shutdown it stops what it started.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp, ExtensionAppJinjaMixin

from gpusession.identity import current_user
from gpusession.run.caller.kernelcell import NOTEBOOK_ROOT_ENV

from . import announce, handlers, kernelenv, pages
from .backend import Backend
from .config import GPUSession
from .runactivity import RunActivity

HERE = Path(__file__).parent


class GPUSessionApp(ExtensionAppJinjaMixin, ExtensionApp):
    name = "gpusession"
    description = "GPU sessions on Ray: leases, quotas and the admin page."
    load_other_extensions = True
    classes = [GPUSession]
    static_paths = [str(HERE / "static")]
    template_paths = [str(HERE / "templates")]

    def initialize_settings(self) -> None:
        self.options = GPUSession(parent=self)  # bad c.GPUSession values raise here, at load
        self.backend = Backend(self.options, owner=current_user(), log=self.log, announce=self._announce)
        kernelenv.install(self.serverapp.kernel_manager, self._kernel_env)
        self.run_activity = RunActivity(self.backend, self.serverapp.web_app.settings,
                                        interval_s=self.options.run_activity_s, server_pid=os.getpid(), log=self.log)

    def initialize_handlers(self) -> None:
        self.handlers.extend([
            (rf"/{self.name}/api/cluster", handlers.ClusterHandler),
            (rf"/{self.name}/api/status", handlers.StatusHandler),
            (rf"/{self.name}/api/whoami", handlers.WhoAmIHandler),
            (rf"/{self.name}/api/leases", handlers.LeasesHandler),
            (rf"/{self.name}/api/leases/([^/]+)", handlers.LeaseHandler),
            (rf"/{self.name}/api/runs", handlers.DetachedRunsHandler),
            (rf"/{self.name}/api/runs/([^/]+)", handlers.DetachedRunHandler),
            (rf"/{self.name}/api/quotas", handlers.QuotasHandler),
            (rf"/{self.name}/api/quotas/([^/]+)", handlers.QuotaHandler),
            (rf"/{self.name}/api/usage", handlers.UsageHandler),
            (rf"/{self.name}/admin", pages.AdminPageHandler),
            (rf"/{self.name}/metrics", pages.MetricsHandler),
        ])

    async def _kernel_env(self) -> dict:
        """The backend's variables, and the server's root: a lease names its notebook relative to it."""
        return {**await self.backend.kernel_env(), NOTEBOOK_ROOT_ENV: self.serverapp.root_dir}

    def _announce(self, ray_env: dict) -> None:
        """Tell this user's `gpusession` CLI where to ask quickly (gpusession.cli.access)."""
        announce.write(self.serverapp, ray_env.get("RAY_ADDRESS", ""))

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        """The server runs (it passed its own checks, e.g. --allow-root): bring the cluster up now,
        and (behind a gateway) count its kernels' live runs as its activity."""
        self.backend.start()
        self.run_activity.start()

    async def stop_extension(self) -> None:
        """Called by the server at shutdown, before it stops the kernels itself: stop the kernels
        first when the head is ours (a kernel whose cluster vanished under it would be restarted
        by its manager just to be shut down), then the bridge and the head."""
        backend = getattr(self, "backend", None)  # None when bad config stopped the extension loading
        if backend is None:
            return
        self.run_activity.stop()
        announce.remove()
        if backend.head is not None:
            kernels = self.serverapp.kernel_manager
            if kernels.list_kernel_ids():
                self.log.info("gpusession: shutting down %d kernels before the local Ray head",
                              len(kernels.list_kernel_ids()))
                await ensure_async(kernels.shutdown_all())
        await asyncio.to_thread(backend.stop)
