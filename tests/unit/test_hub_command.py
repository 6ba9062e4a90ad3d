"""`gpusession hub`'s pure parts: its help, its options and config file, the JupyterHub config it writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpusession.cli.main import build_parser
from gpusession.hub import run as hub_run
from gpusession.hub.cli import options_from
from gpusession.hub.plan import HubLayout, HubOptions, broker_policy, jupyterhub_config, user_environment

LAYOUT = HubLayout(Path("/opt/gsh"), Path("/var/lib/gsh"), "gpusvc")


def test_hub_help_starts_with_a_two_line_quick_start():
    out = subprocess.run([sys.executable, "-m", "gpusession.cli", "hub", "--help"], capture_output=True,
                         text=True, check=True).stdout
    quick = out[out.index("quick start"):].splitlines()[1:3]
    assert quick[0].strip().startswith("scripts/setup --hub") and "useradd" in quick[0]
    assert quick[1].strip().startswith("gpusession hub --admin")


def test_admins_come_from_the_command_line_and_the_config_file(tmp_path):
    config = tmp_path / "hub.json"
    config.write_text(json.dumps({"admins": ["carol"], "default_quota": {"max_gpus": 2}}))
    args = build_parser().parse_args(["hub", "--admin", "alice", "--config", str(config)])
    layout, options = options_from(args)
    assert options.admins == ("alice", "carol")
    assert broker_policy(layout, options) == {"default_quota": {"max_gpus": 2}, "require_signed_identity": True,
                                              "db_path": str(layout.cluster_dir / "ledger.db")}


@pytest.mark.parametrize("content, field", [('{"admin": ["x"]}', "'admin'"), ('{"admins": "x"}', "admins"),
                                            ("not json", "JSON")])
def test_a_bad_config_file_is_refused_naming_the_field(tmp_path, content, field):
    config = tmp_path / "hub.json"
    config.write_text(content)
    with pytest.raises(ValueError, match=field):
        options_from(build_parser().parse_args(["hub", "--config", str(config)]))


def test_the_jupyterhub_config_signs_every_spawn_and_runs_servers_as_their_users():
    options = HubOptions("127.0.0.1", 8000, ("alice",), 4, 8081, 8001)
    env = user_environment(LAYOUT)
    text = jupyterhub_config(LAYOUT, options, user_env=env)
    c = _Config()
    exec(text.replace("from gpusession.hub.spawnhook import pre_spawn_hook", ""),
         {"c": c, "pre_spawn_hook": lambda **kw: ("hook", kw)})
    assert c.values["JupyterHub.authenticator_class"] == "pam"
    assert c.values["JupyterHub.spawner_class"] == "localprocess"
    assert c.values["Authenticator.admin_users"] == ["alice"]
    assert c.values["Spawner.cmd"] == ["/opt/gsh/venv/bin/jupyterhub-singleuser"]
    # users hold the gateway's socket and nothing of Ray's; no server gets the admin token
    assert c.values["Spawner.environment"]["GPUSESSION_GATEWAY"] == "/var/lib/gsh/gateway/gateway.sock"
    assert not [name for name in c.values["Spawner.environment"] if name.startswith("RAY_")]
    assert c.values["Spawner.pre_spawn_hook"] == ("hook", {"key_path": "/var/lib/gsh/cluster/identity_key",
                                                           "admin_token_path": "/var/lib/gsh/cluster/admin_token",
                                                           "admins": [], "owner": "gpusvc"})


def test_the_hub_refuses_to_start_without_root_or_its_environment(monkeypatch, capsys):
    monkeypatch.setattr(hub_run.os, "geteuid", lambda: 1000)
    assert "run it with sudo" in hub_run._refusal(LAYOUT)
    monkeypatch.setattr(hub_run.os, "geteuid", lambda: 0)
    assert "scripts/setup --hub" in hub_run._refusal(LAYOUT)


class _Config:
    """`c` of a config file: c.Section.name = value, recorded as "Section.name"."""

    def __init__(self) -> None:
        self.values: dict = {}

    def __getattr__(self, section):
        values = self.values

        class Section:
            def __setattr__(self, name, value):
                values[f"{section}.{name}"] = value

        return Section()


def test_the_hub_counts_as_ready_only_when_its_own_api_answers_through_the_proxy():
    """A real HTTP server in place of the proxy: its 404 (no route to the Hub yet) and a 200 that
    is not the Hub's API are not "ready"; the Hub's root API answer (200, JSON with a version) is."""
    import http.server
    import threading

    answers = iter([(404, b"404 Not Found"), (503, b"Service Unavailable"), (200, b"<html>not the hub</html>"),
                    (200, b'{"version": "6.1.1"}')])
    seen: list[int] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = next(answers)
            seen.append(status)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hub/api/"
    try:
        running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert hub_run.wait_answering(running, url, timeout_s=30)
        finally:
            running.kill()
            running.wait()
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [404, 503, 200, 200], "ready came before the Hub's own answer"


def _hub_config(options: HubOptions) -> dict:
    c = _Config()
    exec(jupyterhub_config(LAYOUT, options, user_env=user_environment(LAYOUT)).replace(
        "from gpusession.hub.spawnhook import pre_spawn_hook", ""), {"c": c, "pre_spawn_hook": lambda **kw: None})
    return c.values


def _culling(*flags: str):
    return options_from(build_parser().parse_args(["hub", *flags]))[1].culling


def test_the_hub_runs_the_idle_culler_by_default_as_the_service_account_with_a_one_hour_timeout():
    options = HubOptions("127.0.0.1", 8000, (), 4, 8081, 8001, culling=_culling())
    values = _hub_config(options)
    [culler] = values["JupyterHub.services"]
    assert culler["command"] == ["/opt/gsh/venv/bin/python", "-m", "jupyterhub_idle_culler", "--timeout=3600",
                                 "--cull-every=600"]
    assert (culler["user"], culler["cwd"]) == ("gpusvc", "/")  # not root
    assert values["JupyterHub.load_roles"] == [{"name": "idle-culler", "services": ["idle-culler"], "scopes": [
        "list:users", "read:users:activity", "read:servers", "delete:servers"]}]
    # servers tell the Hub their activity every 5 min, and ask the gateway for live runs twice as often
    assert values["Spawner.environment"]["JUPYTERHUB_ACTIVITY_INTERVAL"] == "300"
    assert "--GPUSession.run_activity_s=150" in values["Spawner.args"]


def test_a_short_timeout_makes_the_culler_look_and_servers_report_as_often_as_it_needs():
    values = _hub_config(HubOptions("127.0.0.1", 8000, (), 4, 8081, 8001, culling=_culling("--cull-idle-after", "30")))
    assert values["JupyterHub.services"][0]["command"][-2:] == ["--timeout=30", "--cull-every=5"]
    assert values["Spawner.environment"]["JUPYTERHUB_ACTIVITY_INTERVAL"] == "5"
    assert "--GPUSession.run_activity_s=2.5" in values["Spawner.args"]
    assert _culling("--cull-idle-after", "2h").idle_after_s == 7200


def test_no_cull_runs_no_culler_and_no_run_activity_turns_off_the_servers_report_of_live_runs():
    values = _hub_config(HubOptions("127.0.0.1", 8000, (), 4, 8081, 8001, culling=_culling("--no-cull")))
    assert "JupyterHub.services" not in values and "JupyterHub.load_roles" not in values
    values = _hub_config(HubOptions("127.0.0.1", 8000, (), 4, 8081, 8001, culling=_culling("--no-run-activity")))
    assert "--GPUSession.run_activity_s=0" in values["Spawner.args"] and values["JupyterHub.services"]


@pytest.mark.parametrize("value", ["5", "0", "-30", "soon", "9.5s"])
def test_a_culler_timeout_under_ten_seconds_or_not_a_time_is_refused_naming_the_option(value, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hub", "--cull-idle-after", value])
    err = capsys.readouterr().err
    assert "--cull-idle-after" in err and "at least 10 seconds" in err and "--no-cull" in err


def test_no_cull_with_a_culler_timeout_is_refused_as_a_contradiction():
    with pytest.raises(ValueError, match="--no-cull and --cull-idle-after contradict"):
        _culling("--no-cull", "--cull-idle-after", "1h")


def test_the_bytes_of_calls_per_account_reach_the_gateways_settings_and_a_bad_size_is_refused_naming_it():
    from gpusession.hub.plan import gateway_settings

    layout, options = options_from(build_parser().parse_args(["hub", "--call-bytes-per-user", "8G"]))
    assert options.call_bytes == 8 * 2**30 and gateway_settings(layout, options)["call_bytes"] == 8 * 2**30
    layout, options = options_from(build_parser().parse_args(["hub"]))
    assert gateway_settings(layout, options)["call_bytes"] is None  # the gateway takes a quarter of its machine's
    with pytest.raises(ValueError, match="--call-bytes-per-user 'lots'"):
        options_from(build_parser().parse_args(["hub", "--call-bytes-per-user", "lots"]))
