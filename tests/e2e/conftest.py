"""A real JupyterLab process (`python -m jupyterlab`, with the gpusession extension, on the session's
Ray cluster) and a real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright. One
server for the whole session: the browser tests open JupyterLab itself and the admin page."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..ports import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
ADMIN = "tester"


@dataclass
class Server:
    url: str
    token: str

    runtime_dir: Path | None = None
    log: Path | None = None

    def diagnose(self) -> str:
        """What a failing browser test should print: the server's kernels and sessions, and its log's tail."""
        parts = []
        for route in ("api/kernels", "api/sessions"):
            request = urllib.request.Request(f"{self.url}/{route}", headers={"Authorization": f"token {self.token}"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    parts.append(f"{route}: {response.read().decode()[:2000]}")
            except OSError as error:
                parts.append(f"{route}: {error}")
        if self.log is not None and self.log.exists():
            parts.append("server log tail:\n" + self.log.read_text()[-4000:])
        return "\n".join(parts)

    def admin_page(self) -> str:
        return f"{self.url}/gpusession/admin?token={self.token}"  # the token logs the browser in

    def lab(self, path: str = "") -> str:
        return f"{self.url}/lab{'/tree/' + path if path else ''}?token={self.token}&reset"

    def put_notebook(self, name: str, cells: list[str]) -> None:
        """Create (or replace) a notebook of code cells through Jupyter's contents API."""
        notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "source": source, "metadata": {}, "outputs": [],
                       "execution_count": None} for i, source in enumerate(cells)]}
        body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
        request = urllib.request.Request(f"{self.url}/api/contents/{name}", data=body, method="PUT",
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):
            pass


def _answers(url: str, token: str) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def lab_bundle_matches_checkout() -> str | None:
    """JupyterLab serves the gpusession-lab bundle that `scripts/setup` copied into this Python's
    prefix, not the checkout's `jupyter_ext/labextension`: after a rebuild or a pull the browser
    tests would drive the old one (seen: a test failed on a sidebar label the old bundle lacked).
    None when the two are the same; else what to do."""
    ours = ROOT / "jupyter_ext" / "labextension"
    served = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "gpusession-lab"
    differ = [str(path.relative_to(ours)) for path in sorted(ours.rglob("*")) if path.is_file()
              and (not (served / path.relative_to(ours)).is_file()
                   or (served / path.relative_to(ours)).read_bytes() != path.read_bytes())]
    if differ:
        return (f"JupyterLab would serve another gpusession-lab bundle ({served}) than this checkout's "
                f"({', '.join(differ[:3])} differ): run `scripts/setup --test` again")
    return None


@pytest.fixture(scope="session")
def jupyter(cluster, tmp_path_factory):
    """JupyterLab on a free port; its owner `tester` is the gpusession admin; its settings and
    workspaces are its own (no state from an earlier run or another user)."""
    stale = lab_bundle_matches_checkout()
    if stale:
        pytest.fail(stale)
    with lab_server(cluster, tmp_path_factory.mktemp("jupyter-config"), admin_users=[ADMIN]) as server:
        yield server


@contextlib.contextmanager
def lab_server(cluster, config_dir: Path, *, admin_users: list[str]):
    """A JupyterLab process whose owner is `tester`, with these gpusession admins, stopped after."""
    token, port = "e2e-token", free_port()
    (config_dir / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"jpserver_extensions": {"gpusession": True}, "port": port, "ip": "127.0.0.1",
                      "open_browser": False, "allow_root": True, "root_dir": str(config_dir)},
        "IdentityProvider": {"token": token},
        "LabApp": {"user_settings_dir": str(config_dir / "lab-settings"),
                   "workspaces_dir": str(config_dir / "lab-workspaces"), "news_url": None},
        "GPUSession": {"ray_address": cluster.address, "admin_token": cluster.admin_token, "admin_users": admin_users},
    }))
    # no "news?" toast over the screenshots
    news = config_dir / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = cluster.env(GPUSESSION_USER=ADMIN, JUPYTER_CONFIG_DIR=str(config_dir),
                      JUPYTER_RUNTIME_DIR=str(config_dir / "runtime"))
    log = open(config_dir / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=str(config_dir))
    server = Server(f"http://127.0.0.1:{port}", token, config_dir / "runtime", config_dir / "server.log")
    try:
        deadline = time.monotonic() + 180
        while not _answers(f"{server.url}/gpusession/api/cluster", token):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"jupyter server did not come up; log:\n{(config_dir / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    """Module-scoped on purpose: Playwright's sync API keeps its own asyncio loop running while it
    is open, which would break the event loops of tests that run after this module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, jupyter):
    """A fresh light-scheme page; fails the test if the page opens any dialog (alert, confirm)."""
    context = browser.new_context(color_scheme="light", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    context.close()
    assert page.dialogs == [], f"the page opened dialogs: {page.dialogs}"


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
