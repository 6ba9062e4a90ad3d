"""A real Jupyter server (jupyter_server's ServerApp, with the extensions its config names) on a
thread of its own with its own event loop, for a test module whose tests share it: pytest-jupyter's
`jp_serverapp` starts and stops one per test (about 2.8 s here with the gpusession extension, whose
backend connects to the cluster each time). Requests go over real HTTP to its port."""
from __future__ import annotations

import asyncio
import threading
import urllib.parse
from pathlib import Path

import jupyter_core.paths
import pytest
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import url_path_join
from tornado.escape import url_escape
from tornado.httpclient import HTTPClient, HTTPResponse
from traitlets.config import Config

from ..ports import free_port

START_TIMEOUT_S = 120.0


class ThreadedJupyterServer:
    """start() returns once the server answers on 127.0.0.1; stop() shuts it down as Jupyter does
    (extensions' stop hooks, kernels, the HTTP server) and ends its thread. The environment it reads
    (HOME, Jupyter's config, data and runtime folders) is a fresh one under `top`, as pytest-jupyter
    gives each of its servers, and is put back by stop()."""

    def __init__(self, config: Config, top: Path):
        self.config = Config(config)
        self.config.IdentityProvider.token = "t0ken"  # not used by a header identity provider; never empty
        self.config.NotebookNotary.db_file = ":memory:"
        self.top = top
        self.port = free_port()
        self.app: ServerApp | None = None
        self._thread: threading.Thread | None = None
        self._environ = pytest.MonkeyPatch()
        self._client = HTTPClient()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> ServerApp:
        self._isolate()
        started = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(asyncio.new_event_loop())
            try:
                app = ServerApp(config=self.config, port=self.port, port_retries=0, ip="127.0.0.1",
                                open_browser=False, allow_root=True, root_dir=str(self.top / "root"),
                                log_level="WARN")
                app.init_signal = lambda: None  # signal handlers belong to the main thread
                app.initialize(argv=[])
                self.app = app
                app.io_loop.add_callback(started.set)
            except BaseException as exc:  # the test thread raises it
                failed.append(exc)
                started.set()
                return
            app.start()  # until stop(): start_app, then the event loop (extensions start on it)

        self._thread = threading.Thread(target=serve, name="jupyter-server", daemon=True)
        self._thread.start()
        if not started.wait(START_TIMEOUT_S) or failed:
            self.stop()
            if failed:
                raise RuntimeError(f"the Jupyter server could not start: {failed[0]!r}") from failed[0]
            raise RuntimeError(f"the Jupyter server did not start within {START_TIMEOUT_S:.0f} s")
        return self.app

    def fetch(self, *parts: str, method: str = "GET", params: dict | None = None, **kwargs) -> HTTPResponse:
        """As pytest-jupyter's jp_fetch: the path's parts joined and escaped, the query encoded; a
        status other than 2xx raises tornado's HTTPClientError (with .code and .response)."""
        path = url_escape(url_path_join(*parts), plus=False)
        query = urllib.parse.urlencode(params or {})
        return self._client.fetch(f"{self.url}{path}?{query}", method=method, request_timeout=60,
                                  allow_nonstandard_methods=True, **kwargs)

    def stop(self) -> None:
        app, thread = self.app, self._thread
        try:
            if app is not None and thread is not None and thread.is_alive():
                app.io_loop.add_callback(app._stop)  # what Ctrl-C does, from its own loop
                thread.join(60)
                assert not thread.is_alive(), "the Jupyter server's thread did not end within 60 s of the stop"
        finally:
            self._client.close()
            self._environ.undo()

    def _isolate(self) -> None:
        dirs = {name: self.top / name for name in ("home", "config", "data", "runtime", "root", "system", "env")}
        for folder in dirs.values():
            folder.mkdir(parents=True, exist_ok=True)
        env = self._environ
        env.setenv("HOME", str(dirs["home"]))
        env.setenv("JUPYTER_CONFIG_DIR", str(dirs["config"]))
        env.setenv("JUPYTER_DATA_DIR", str(dirs["data"]))
        env.setenv("JUPYTER_RUNTIME_DIR", str(dirs["runtime"]))
        for name in ("SYSTEM_JUPYTER_PATH", "SYSTEM_CONFIG_PATH"):
            env.setattr(jupyter_core.paths, name, [str(dirs["system"])])
        for name in ("ENV_JUPYTER_PATH", "ENV_CONFIG_PATH"):
            env.setattr(jupyter_core.paths, name, [str(dirs["env"])])
