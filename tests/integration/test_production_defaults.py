"""The broker as users get it: the embedded default cluster with the broker's default policy
(grace periods, heartbeat and claim timeouts), not the session cluster's shortened ones (3 s).
One fresh process (production_defaults_script.py) with its own Ray head on free ports and its own
GPUSESSION_HOME, so nothing of the session's cluster is involved. Slow: its own Ray head."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.broker.service.settings import DEFAULTS

from ..conftest import ROOT

SCRIPT = Path(__file__).with_name("production_defaults_script.py")
TAKEN_BACK_MARGIN_S = 10.0  # the broker reconciles once a second; the rest is a loaded machine's slack
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GPUSESSION_DB_PATH")}
    env.update(GPUSESSION_HOME=str(tmp_path_factory.mktemp("production-home")), PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=540)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_the_embedded_broker_runs_with_the_documented_default_policy(result):
    assert result["policy"] == DEFAULTS, "the broker a user gets does not run the default policy"


def test_a_two_gpu_run_on_the_default_broker_allreduces(result):
    assert result["sum"] == 3.0  # ranks 1 + 2


def test_a_revoked_lease_whose_holder_ignores_the_notice_is_taken_back_after_the_default_grace(result):
    grace = DEFAULTS["revoke_grace_s"]
    assert result["end_reason"] == "revoked", result
    assert grace <= result["taken_back_s"] <= grace + TAKEN_BACK_MARGIN_S, (
        f"taken back {result['taken_back_s']} s after the revoke; the default grace is {grace} s "
        f"(bound: not before it, and within {TAKEN_BACK_MARGIN_S:.0f} s after it)")
