"""`gpusession cluster start|stop|status`: a local Ray head outside Jupyter, recorded where
kernels and scripts on this machine find it, and stopped without touching any other cluster."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import psutil
import pytest

from gpusession.cluster import localhead
from gpusession.cli.main import main as gpusession

from ..conftest import wait_for
from ..machine import cuda_gpus, own_cluster_logical


@pytest.mark.parametrize("command", [[], ["start"], ["stop"], ["status"]])
def test_every_cluster_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        gpusession(["cluster", *command, "--help"])
    assert done.value.code == 0 and "Ray head" in capsys.readouterr().out


def test_status_without_a_head_says_how_to_start_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    assert gpusession(["cluster", "status"]) == 1 and "gpusession cluster start" in capsys.readouterr().out
    assert gpusession(["cluster", "stop"]) == 0 and "nothing to stop" in capsys.readouterr().out


@pytest.mark.slow  # starts its own Ray head
def test_start_records_a_head_that_scripts_join_and_stop_ends_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    try:
        assert gpusession(["cluster", "start", "--gpus", "2"]) == 0
        head = localhead.status()
        logical = own_cluster_logical()  # --gpus is ignored where the machine has real GPUs: all are used
        assert head is not None and head.gpus == (2 if logical else cuda_gpus()) and head.logical is logical
        assert f"Started local Ray head at {head.address}" in capsys.readouterr().out
        assert gpusession(["cluster", "start"]) == 0 and "Already running" in capsys.readouterr().out
        joined = subprocess.run(
            [sys.executable, "-c", "import ray; ray.init(); print(ray.cluster_resources()['GPU'])"],
            env={**os.environ, **head.client_env()}, capture_output=True, text=True, timeout=120, check=False)
        assert joined.stdout.strip().endswith("2.0"), joined.stderr[-2000:]
        # A gpusession script with no address and no Ray auth settings finds the recorded head.
        bare = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
        ran = subprocess.run(
            [sys.executable, "-c", "import ray, gpusession as gs\n"
             "print(gs.distributed(gpus=2, return_all=True)(lambda: gs.context().rank)(), "
             "ray.get_runtime_context().gcs_address)"],
            env=bare, capture_output=True, text=True, timeout=180, check=False)
        assert ran.stdout.strip().endswith(f"[0, 1] {head.address}"), ran.stdout[-1000:] + ran.stderr[-2000:]
    finally:
        assert gpusession(["cluster", "stop"]) == 0
    assert "Stopped the local Ray head" in capsys.readouterr().out
    assert not psutil.pid_exists(head.pid) and localhead.status() is None
    assert not (tmp_path / "local-head.json").exists()


def test_stop_never_signals_a_process_that_got_the_recorded_heads_pid(tmp_path, monkeypatch, capsys):
    """The recorded head died and the OS gave its pid to another `--block` process (pids are
    reused once the counter wraps): `cluster stop` forgets the record and leaves that process be."""
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--block"],
                                start_new_session=True)
    try:
        wait_for(lambda: "--block" in psutil.Process(stranger.pid).cmdline(), timeout=10, message="the stranger running")
        started = psutil.Process(stranger.pid).create_time()
        record = localhead.LocalHead("127.0.0.1:1", stranger.pid, 2, True, started - 600, str(tmp_path / "log"),
                                     process_started=started - 600)  # the head that had this pid before
        (tmp_path / "local-head.json").write_text(json.dumps(dataclasses.asdict(record)))
        assert localhead.status() is None
        assert gpusession(["cluster", "stop"]) == 0
        assert "was no longer running; removed its record" in capsys.readouterr().out
        assert not (tmp_path / "local-head.json").exists()
        assert stranger.poll() is None  # alive, never signalled
    finally:
        stranger.kill()
        stranger.wait()
