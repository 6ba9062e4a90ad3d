"""Where `gpusession hub` listens and how a Ray head keeps out of other clusters' ports: loopback by
default, TLS or an explicit --insecure-http for anything else, and every bad value refused naming
its option; `gpusession lab` keeps Jupyter's token off the command line and its log private."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpusession.cli.main import build_parser
from gpusession.cluster import localhead
from gpusession.hub.cli import options_from
from gpusession.hub.plan import INSECURE_WARNING, HubLayout, is_loopback, jupyterhub_config, listen_refusal
from gpusession.cli.lab import private_log


def parse(*argv: str):
    return build_parser().parse_args(["hub", *argv])


def test_the_hub_listens_on_loopback_only_unless_told_otherwise():
    _, options = options_from(parse())
    assert options.ip == "127.0.0.1" and options.url == "http://127.0.0.1:8000/"


@pytest.mark.parametrize("ip", ["0.0.0.0", "192.0.2.7", "", "hub.example.org", "::"])
def test_a_network_address_without_tls_is_refused_naming_the_options_to_use(ip):
    refusal = listen_refusal(ip, None, None, False)
    assert refusal and "--ssl-cert and --ssl-key" in refusal and "--insecure-http" in refusal
    with pytest.raises(ValueError, match="plain HTTP"):
        options_from(parse("--ip", ip))


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_addresses_need_no_tls(ip):
    assert is_loopback(ip) and listen_refusal(ip, None, None, False) is None


def test_insecure_http_is_taken_when_asked_for_by_name_and_warns_why():
    _, options = options_from(parse("--ip", "0.0.0.0", "--insecure-http"))
    assert options.insecure_http and options.url == "http://0.0.0.0:8000/"
    warning = INSECURE_WARNING.format(ip="0.0.0.0")
    assert "passwords" in warning and "--ssl-cert" in warning


def test_tls_needs_both_files_and_they_must_exist(tmp_path):
    cert, key = tmp_path / "hub.pem", tmp_path / "hub.key"
    assert "go together" in listen_refusal("0.0.0.0", cert, None, False)
    assert "contradict" in listen_refusal("0.0.0.0", cert, key, True)
    with pytest.raises(ValueError, match=r"--ssl-cert .*hub.pem: no such file"):
        options_from(parse("--ip", "0.0.0.0", "--ssl-cert", str(cert), "--ssl-key", str(key)))
    cert.write_text("cert")
    key.write_text("key")
    layout, options = options_from(parse("--ip", "0.0.0.0", "--ssl-cert", str(cert), "--ssl-key", str(key)))
    assert options.url == "https://0.0.0.0:8000/"
    config = jupyterhub_config(layout, options, user_env={})
    assert f"c.JupyterHub.ssl_cert = {str(cert)!r}" in config and f"c.JupyterHub.ssl_key = {str(key)!r}" in config


@pytest.mark.parametrize("argv, message", [(["--gpus", "0"], "at least 1"), (["--gpus", "two"], "whole number"),
                                           (["--port", "0"], "1 to 65535"), (["--port", "70000"], "1 to 65535")])
def test_bad_gpus_or_port_are_refused_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse(*argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and message in err


def test_the_jupyterhub_config_reads_secrets_as_the_service_accounts_own():
    layout = HubLayout(Path("/opt/gsh"), Path("/var/lib/gsh"), "gpusvc")
    _, options = options_from(parse())
    assert "owner='gpusvc'" in jupyterhub_config(layout, options, user_env={})


def test_every_server_of_a_local_ray_head_gets_a_free_port_of_its_own():
    ports = iter(range(40001, 40100))
    flags = localhead.port_options(lambda: next(ports))
    named = dict(flag.split("=") for flag in flags)
    assert set(localhead.PORT_FLAGS) <= set(named)
    assert "--ray-client-server-port" in named and named["--ray-client-server-port"] != "10001"
    assert named["--min-worker-port"] == named["--max-worker-port"] == "0"  # the OS picks each worker's port
    assert len({named[flag] for flag in localhead.PORT_FLAGS}) == len(localhead.PORT_FLAGS)


def test_a_heads_failure_names_the_log_line_that_shows_its_cause():
    log = ("Ray runtime started.\n"
           "E1128 12:42:52 add_port.cc:83] Failed to add port to server: No address added out of total 1 resolved "
           "for '127.0.0.1:10001' (Error in bind for address '[::ffff:127.0.0.1]:10001': Address already in use)\n"
           "RuntimeError: Failed to bind to address 127.0.0.1:10001\n")
    assert "10001" in localhead.failure_cause(log) and "Failed to add port" in localhead.failure_cause(log)
    assert localhead.failure_cause("Ray runtime started.\n") is None


def test_the_lab_log_holding_jupyters_token_is_private_even_when_it_existed(tmp_path):
    log = tmp_path / "lab.log"
    log.write_text("old")
    os.chmod(log, 0o644)
    with private_log(log) as out:
        out.write("http://localhost:8888/lab?token=secret")
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600 and "old" not in log.read_text()


def test_the_lab_log_is_not_written_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "lab.log").symlink_to(target)
    with pytest.raises(OSError):
        private_log(tmp_path / "lab.log")
    assert target.read_text() == "keep"
