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
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from gpusession.run.node import leftovers

from ..hub.client import HubUser
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


CALL = textwrap.dedent("""
    import gpusession as gs

    @gs.distributed(gpus=1)
    def answer():
        return 42

    print("ANSWER", answer())
""")  # in a kernel of the lab's server (its cluster takes only identities the server signed)


class LabUser(HubUser):
    """A browser's user of the lab's server (at its root, with the lab's token), without the browser."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(url, "lab-user", "")
        self.token = token

    def server_path(self, user: str | None = None) -> str:
        return ""


@pytest.fixture
def lab_home():
    base = Path(tempfile.mkdtemp(prefix="gslab", dir="/tmp"))  # short: Ray's socket paths
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(UP_S + 240)  # past UP_S and the stop's 120 s: a lab that never gets ready fails saying why
def test_gpusession_lab_keeps_its_token_off_command_lines_and_stops_and_removes_what_it_started(lab_home):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "JUPYTER_TOKEN")}
    lab_tmp = lab_home / "tmp"  # the lab's temporary folder, where its node host makes its warm folder
    lab_tmp.mkdir()
    env.update(GPUSESSION_HOME=str(lab_home / "home"), RAY_TMPDIR=str(lab_home), TMPDIR=str(lab_tmp),
               PYTHONUNBUFFERED="1")
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
        ran = LabUser(f"http://127.0.0.1:{port}", token).run(CALL, timeout_s=180)
        assert ran.error is None and "ANSWER 42" in ran.stdout, (ran.error, ran.stdout[-3000:])
        assert any(path.name.startswith(leftovers.WARM_PREFIX) for path in leftovers.found(lab_tmp)), \
            "the lab's node host made no warm folder in the lab's temporary folder"
    finally:
        lab.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            lab.wait(timeout=120)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait()
    assert not psutil.pid_exists(head) or psutil.Process(head).status() == psutil.STATUS_ZOMBIE, \
        "the Ray head gpusession lab started is still running"
    assert leftovers.found(lab_tmp) == set(), "gpusession lab left its cluster's folders in the temporary folder"
