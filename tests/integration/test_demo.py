"""README's first command: `gpusession demo` runs the quickstart notebook through a real kernel
on the embedded default cluster (its own Ray head with logical GPUs) and prints its results."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpusession.run.node import leftovers

from ..conftest import ROOT
from ..machine import backend, device_type, gpus_text, own_cluster_logical

pytestmark = pytest.mark.slow  # starts its own embedded Ray cluster


@pytest.fixture
def demo_tmp():
    """The demo's temporary folder (TMPDIR; Ray's follows it): short, for Ray's socket paths."""
    path = Path(tempfile.mkdtemp(prefix="gsdemo", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_gpusession_demo_runs_the_quickstart_on_the_embedded_cluster_and_prints_the_receipt(tmp_path, demo_tmp):
    kernel_logs = os.path.join(demo_tmp, "gpusession-demo-kernel-*.log")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(GPUSESSION_HOME=str(tmp_path), TMPDIR=str(demo_tmp))  # a fresh user: no recorded head, a new ledger
    result = subprocess.run([sys.executable, "-m", "gpusession.cli", "demo"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "failed" not in out
    logical = own_cluster_logical()
    assert f"trained on 2 workers ({backend(logical=logical)}, device {device_type(logical=logical)})" in out
    assert re.search(gpus_text(2, logical=logical) + r" · queued [\d.]+ s · setup [\d.]+ s · run [\d.]+ s · [\d.]+ GPU·s · released", out)
    accuracy = float(re.search(r"final accuracy ([\d.]+)", out).group(1))
    assert accuracy > 0.9  # the spirals are learned, not just run
    assert "[cell 4: a plot]" in out and "0 leased" in out
    assert glob.glob(kernel_logs) == []  # the kernel's log is kept only when a cell fails
    # the embedded cluster's node host left its warm folder, its ranks the scratch root: both gone
    assert leftovers.found(demo_tmp) == set()
