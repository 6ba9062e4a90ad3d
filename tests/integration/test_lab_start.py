"""`gpusession lab` for real: JupyterLab and its cluster come up, the printed token lets a client
in, no process's command line and no file other accounts may read holds that token, and Ctrl-C
stops JupyterLab and the cluster it started."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from ..ports import free_port

UP_S = 300.0  # JupyterLab, then a Ray head and the broker, on a loaded 2-core machine


def _status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def _logs_of(lab_home: Path) -> str:
    """The ends of JupyterLab's log, of `ray start`'s and of the head's raylet and GCS (all under
    the lab's folder, which the fixture removes after the test): what a failure to get ready says."""
    logs = [lab_home / "home" / "lab.log", lab_home / "home" / "local-head.log",
            *(lab_home / "ray" / "session_latest" / "logs" / name for name in ("raylet.out", "gcs_server.out"))]
    return "".join(f"\n--- the end of {log}:\n{log.read_text(errors='replace')[-2000:]}" for log in logs
                   if log.is_file())


@pytest.fixture
def lab_home():
    base = Path(tempfile.mkdtemp(prefix="gslab", dir="/tmp"))  # short: Ray's socket paths
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(UP_S + 240)  # past UP_S and the stop's 120 s: a lab that never gets ready fails saying why
def test_gpusession_lab_keeps_its_token_off_command_lines_and_stops_what_it_started(lab_home):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "JUPYTER_TOKEN")}
    env.update(GPUSESSION_HOME=str(lab_home / "home"), RAY_TMPDIR=str(lab_home), PYTHONUNBUFFERED="1")
    output = lab_home / "output.txt"
    with open(output, "w") as out:
        lab = subprocess.Popen([sys.executable, "-m", "gpusession.cli", "lab", "--no-browser", "--gpus", "1",
                                "--ip", "127.0.0.1", "--port", str(port)], cwd=lab_home, env=env,
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + UP_S
        while "cluster ready" not in output.read_text() and lab.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        said = output.read_text()
        assert "cluster ready" in said, (f"gpusession lab did not get ready within {UP_S:.0f} s:\n{said[-3000:]}"
                                         f"{_logs_of(lab_home)}")
        token = re.search(r"token=([0-9a-f]+)", said).group(1)
        assert _status(f"http://127.0.0.1:{port}/api/status", token) == 200
        assert _status(f"http://127.0.0.1:{port}/api/status", None) == 403
        family = [psutil.Process(lab.pid), *psutil.Process(lab.pid).children(recursive=True)]
        for proc in family:
            try:
                assert token not in " ".join(proc.cmdline()), f"the token is on the command line of {proc.name()}"
            except psutil.NoSuchProcess:
                pass
        log = lab_home / "home" / "lab.log"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600  # Jupyter may print its URL there
        head = json.loads((lab_home / "home" / "local-head.json").read_text())["pid"]
    finally:
        lab.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            lab.wait(timeout=120)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait()
    assert not psutil.pid_exists(head) or psutil.Process(head).status() == psutil.STATUS_ZOMBIE, \
        "the Ray head gpusession lab started is still running"
