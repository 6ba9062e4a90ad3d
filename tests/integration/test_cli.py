"""The `gpusession` command as an admin and a user type it, against the session cluster."""
from __future__ import annotations

import subprocess
import sys
import uuid

import json

import pytest

import gpusession as gs
from gpusession.broker.protocol.notice import NoticeKind
from gpusession.identity import current_user

from ..conftest import ROOT


def gpusession(cluster, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpusession.cli", *args], env=cluster.env(**env),
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))


@pytest.mark.parametrize("command", [[], ["demo"], ["status"], ["leases"], ["revoke"], ["quota"], ["quota", "set"],
                                     ["quota", "list"], ["quota", "get"], ["quota", "reset"], ["usage"]])
def test_every_command_has_help(command):
    result = subprocess.run([sys.executable, "-m", "gpusession.cli", *command, "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "usage: gpusession" in result.stdout


def test_an_admin_sets_reads_lists_and_resets_a_quota(cluster):
    user = f"cli-{uuid.uuid4().hex[:6]}"
    changed = gpusession(cluster, "quota", "set", user, "--max-gpus", "2", "--gpu-hours", "none",
                         "--max-priority", "high")
    assert changed.returncode == 0, changed.stderr
    got = gpusession(cluster, "quota", "get", user, "--json")
    assert '"max_gpus": 2.0' in got.stdout and '"max_priority": "high"' in got.stdout
    assert user in gpusession(cluster, "quota", "list").stdout
    reset = gpusession(cluster, "quota", "reset", user)
    assert reset.returncode == 0 and "default quota" in reset.stdout
    assert user not in gpusession(cluster, "quota", "list").stdout


def test_bad_quota_input_is_refused_with_the_reason_and_changes_nothing(cluster):
    user = f"cli-{uuid.uuid4().hex[:6]}"
    negative = gpusession(cluster, "quota", "set", user, "--max-gpus", "-1")
    assert negative.returncode == 2 and "expected a number >= 0 (e.g. 2 or 0.5) or 'none'" in negative.stderr
    nothing = gpusession(cluster, "quota", "set", user)
    assert nothing.returncode == 1 and "give at least one of --max-gpus" in nothing.stderr
    assert user not in gpusession(cluster, "quota", "list").stdout


def test_a_user_without_the_admin_token_cannot_change_quotas(cluster):
    refused = gpusession(cluster, "quota", "set", "someone", "--max-gpus", "9", GPUSESSION_ADMIN_TOKEN="not-the-token")
    assert refused.returncode == 1 and "needs the broker's admin token" in refused.stderr


def test_leases_shows_a_held_lease_and_revoke_ends_it(cluster, quiet):
    held = gs.lease(gpus=1)
    try:
        listed = gpusession(cluster, "leases")
        assert str(held.lease_id) in listed.stdout and "placed" in listed.stdout
        revoked = gpusession(cluster, "revoke", str(held.lease_id))
        assert revoked.returncode == 0 and "notified" in revoked.stdout
        assert held.notice(wait=True).kind is NoticeKind.REVOKE
    finally:
        held.release("revoked")


def test_usage_reports_gpu_hours_per_user_and_day(cluster, quiet):
    @gs.distributed(gpus=1)
    def short():
        return 1

    short()
    by_day = gpusession(cluster, "usage", "--by", "day", "--json")
    assert by_day.returncode == 0
    today = __import__("time").strftime("%Y-%m-%d", __import__("time").gmtime())
    mine = [r for r in json.loads(by_day.stdout) if r["user"] == current_user() and r["day"] == today]
    assert len(mine) == 1 and mine[0]["gpu_hours"] > 0  # the call just made, on today's row
    table = gpusession(cluster, "usage", "--by", "day")
    assert table.stdout.splitlines()[0].split() == ["user", "day", "gpu_hours"]
    bad = gpusession(cluster, "usage", "--since", "yesterday")
    assert bad.returncode == 2 and "expected YYYY-MM-DD" in bad.stderr


def test_status_without_any_cluster_says_how_to_start_one(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    env["GPUSESSION_HOME"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "gpusession.cli", "status"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "gpusession cluster start" in result.stderr
