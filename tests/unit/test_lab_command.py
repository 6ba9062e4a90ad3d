"""`gpusession lab`: the JupyterLab command it runs, and how the CLI finds a server to ask."""
from __future__ import annotations

import json
import os
import sys

import pytest

from gpusession.cli import access as cli_access
from gpusession.cli.main import build_parser
from gpusession.cli.lab import plan


def test_lab_runs_jupyterlab_with_the_extension_a_token_and_the_chosen_port():
    chosen = plan(port=8890, ip="localhost", gpus=2, open_browser=False, notebook_dir="/home/alice/notebooks", extra=[],
                  is_root=False, token="t0k")
    assert chosen.command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert "--ServerApp.jpserver_extensions=gpusession=True" in chosen.command
    assert {"--ServerApp.port=8890", "--ServerApp.port_retries=0",
            "--GPUSession.local_gpus=2", "--ServerApp.root_dir=/home/alice/notebooks",
            "--ServerApp.open_browser=False"} <= set(chosen.command)
    assert "--allow-root" not in chosen.command
    assert chosen.url == "http://localhost:8890/lab?token=t0k"
    assert chosen.admin_url == "http://localhost:8890/gpusession/admin?token=t0k"
    assert chosen.env == {"JUPYTER_TOKEN": "t0k"}
    assert not any("t0k" in arg for arg in chosen.command), "any account may read a command line"


def test_as_root_lab_passes_allow_root_and_the_users_own_options_last():
    chosen = plan(port=None, ip="0.0.0.0", gpus=None, open_browser=True, notebook_dir=None,
                  extra=["--ServerApp.base_url=/gpus/"], is_root=True)
    assert "--allow-root" in chosen.command and chosen.command[-1] == "--ServerApp.base_url=/gpus/"
    assert chosen.port == 8888 and len(chosen.token) == 48
    assert not any(arg.startswith("--GPUSession.local_gpus") for arg in chosen.command)


def test_the_lab_command_takes_jupyter_options_after_a_double_dash():
    args = build_parser().parse_args(["lab", "--no-browser", "--port", "9999", "--", "--ServerApp.base_url=/x/"])
    assert args.no_browser and args.port == 9999 and args.jupyter_args[-1] == "--ServerApp.base_url=/x/"


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path


def announce(runtime, pid: int, address: str) -> None:
    record = {"url": "http://127.0.0.1:1/", "token": "t", "ray_address": address, "pid": pid}
    (runtime / "runtime" / f"gpusession-{pid}.json").write_text(json.dumps(record))


def test_the_cli_asks_a_live_server_on_its_own_cluster_only(runtime, monkeypatch):
    announce(runtime, os.getpid(), "10.0.0.1:6379")
    assert cli_access.find_server(None) is None  # no cluster of its own: nothing to match
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert cli_access.find_server(cli_access.target_address()) is None  # another cluster's server
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cli_access.find_server(cli_access.target_address())["pid"] == os.getpid()


def test_the_cli_ignores_the_announcement_of_a_server_that_is_gone(runtime):
    (runtime / "home" / "local-head.json").write_text(json.dumps({"address": "10.0.0.9:1234"}))
    announce(runtime, 2 ** 22 + 7, "10.0.0.9:1234")  # no such process
    assert cli_access.target_address() == "10.0.0.9:1234"
    assert cli_access.find_server("10.0.0.9:1234") is None
