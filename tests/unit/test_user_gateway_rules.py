"""A user's own gateway without Ray (usergateway.py): where its socket lives per cluster, the
directory it accepts, when it exits, which cluster a process has, and the peer check that lets
only its own uid in."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpusession.gateway import usergateway
from gpusession.gateway.peer import Peer
from gpusession.gateway.server import refusal


def test_each_cluster_has_its_own_directory_under_the_gpusession_home():
    home = Path("/h")
    assert usergateway.directory_for(home, "10.0.0.5:6379") == home / "gateways" / "10.0.0.5-6379"
    assert usergateway.directory_for(home, "[::1]:6379") == home / "gateways" / "--1--6379"
    assert usergateway.directory_for(home, "../../x:1").parent == home / "gateways"


def test_the_idle_period_is_ten_minutes_unless_the_variable_names_a_positive_number():
    assert usergateway.idle_limit({}) == usergateway.DEFAULT_IDLE_S == 600
    assert usergateway.idle_limit({usergateway.IDLE_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match=usergateway.IDLE_ENV):
            usergateway.idle_limit({usergateway.IDLE_ENV: bad})


def test_it_exits_when_idle_long_enough_or_when_ray_is_gone():
    def reason(now, busy_at=0.0, misses=0):
        return usergateway.exit_reason(now=now, busy_at=busy_at, idle_s=10, ray_misses=misses, max_misses=3)

    assert reason(now=9.9) is None
    assert "no detached run and no connection for 10 s" in reason(now=10.0)
    assert reason(now=15.0, busy_at=6.0) is None  # busy again since: counted from then
    assert reason(now=1.0, misses=2) is None
    assert "Ray is gone" in reason(now=1.0, misses=3)


def test_a_user_gateway_serves_its_own_uid_alone():
    sessions = {"run": None}
    assert refusal(Peer(1, 1000, 1000, "ann"), "run", sessions, only_uid=1000) is None
    said = refusal(Peer(1, 1001, 1001, "bob"), "run", sessions, only_uid=1000)
    assert "serves uid 1000 alone" in said and "uid 1001 may not use it" in said
    assert refusal(Peer(1, 1001, 1001, "bob"), "run", sessions) is None  # the hub's serves every account


def test_its_directory_is_made_private_and_a_symlink_a_file_or_anothers_is_refused(tmp_path):
    made = usergateway.private_directory(tmp_path / "gateways" / "c-1")
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
    os.chmod(made, 0o755)
    usergateway.private_directory(made)
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700, "a loosened directory is made private again"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "gateways" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "gateways" / "file").write_text("")
    for bad in ("link", "file"):
        with pytest.raises(usergateway.NoUserGateway, match="not a directory"):
            usergateway.private_directory(tmp_path / "gateways" / bad)
    if os.geteuid() == 0:
        theirs = tmp_path / "gateways" / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(usergateway.NoUserGateway, match="belongs to uid 65534, not to you"):
            usergateway.private_directory(theirs)


def test_a_process_has_the_cluster_ray_address_names_else_the_recorded_head_else_none(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert usergateway.cluster_address() is None  # the embedded cluster (Ray is not started in unit tests)
    (tmp_path / "local-head.json").write_text(json.dumps({"address": "10.0.0.9:1234"}))
    assert usergateway.cluster_address() == "10.0.0.9:1234"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert usergateway.cluster_address() == "10.0.0.5:6379"


def test_with_a_cluster_nothing_is_refused_and_without_one_the_refusal_says_what_to_use():
    assert usergateway.detach_refusal("10.0.0.5:6379") is None
    said = usergateway.detach_refusal(None)
    assert "embedded cluster" in said and "`gpusession lab`" in said and "RAY_ADDRESS" in said
