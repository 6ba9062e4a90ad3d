"""`gpusession hub node`'s pure parts and its checks: the options, the node's Ray command and
environment (the token in neither the command line nor anything passed on), the join command the
hub prints, and Ray's token read from stdin or a file only root may read (real files)."""
from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest

from gpusession.cli.main import build_parser
from gpusession.hub.cli import node_options_from, options_from
from gpusession.hub.node import NodeFailed, last_error, output_gone, read_token
from gpusession.hub.nodeplan import NodeOptions, join_command, node_environment, ray_node_command
from gpusession.hub.plan import HubLayout

LAYOUT = HubLayout(Path("/opt/gsh"), Path("/var/lib/gsh"), "gpusvc")
OPTIONS = NodeOptions("10.0.0.1:41234", "-", 2, "10.0.0.12", 1000)


def _parse(*argv: str):
    return build_parser().parse_args(["hub", "node", *argv])


def test_the_node_command_takes_the_hubs_address_and_a_token_file():
    layout, options = node_options_from(_parse("--address", "10.0.0.1:41234", "--token-file", "-", "--node-ip",
                                               "10.0.0.12", "--temp-dir", "/tmp/gsh-n1"))
    assert options == NodeOptions("10.0.0.1:41234", "-", 4, "10.0.0.12", 1000)
    assert layout.ray_tmp == Path("/tmp/gsh-n1") and layout.service_user == "gpusession"


@pytest.mark.parametrize("address", ["10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", ":6379", "127.0.0.1:6379"])
def test_a_bad_head_address_is_refused_naming_the_option(address, capsys):
    with pytest.raises(SystemExit):
        _parse("--address", address, "--token-file", "-")
    assert "--address" in capsys.readouterr().err


@pytest.mark.parametrize("flag, argv", [("--node-ip", ["hub", "node", "--address", "10.0.0.1:1", "--token-file", "-",
                                                        "--node-ip"]),
                                        ("--ray-ip", ["hub", "--ray-ip"])])
@pytest.mark.parametrize("address, why", [("127.0.0.1", "not an address other machines can reach"),
                                          ("0.0.0.0", "not an address other machines can reach"),
                                          ("gpu-1", "not an IP address")])
def test_an_address_other_hosts_cannot_reach_is_refused_naming_the_option(flag, argv, address, why):
    args = build_parser().parse_args([*argv, address])
    read = node_options_from if flag == "--node-ip" else options_from
    with pytest.raises(ValueError, match=why) as refused:
        read(args)
    assert str(refused.value).startswith(flag)


def test_the_nodes_ray_runs_through_noderay_with_ports_of_its_own_and_no_token_on_its_command_line():
    ports = iter(range(20000, 20100))
    command = ray_node_command(LAYOUT.python, OPTIONS, temp_dir=Path("/tmp/gsh-n1"), real_gpus=0,
                               free_port=lambda: next(ports))
    assert command[:3] == ["/opt/gsh/venv/bin/python", "-m", "gpusession.hub.noderay"]
    assert "--address=10.0.0.1:41234" in command and "--block" in command and "--num-gpus=2" in command
    assert "--temp-dir=/tmp/gsh-n1/ray" in command and "--node-ip-address=10.0.0.12" in command
    assert "--node-manager-port=20004" in command and not any("token" in part.lower() for part in command)
    real = ray_node_command(LAYOUT.python, OPTIONS, temp_dir=Path("/t"), real_gpus=8, free_port=lambda: 1)
    assert not [part for part in real if part.startswith("--num-gpus")]  # a machine's real GPUs are all used


def test_the_nodes_ray_gets_the_token_and_its_launcher_and_nothing_else_of_roots_environment():
    inherited = {"RAY_AUTH_TOKEN": "old", "RAY_ADDRESS": "elsewhere:1", "RAY_agent_register_timeout_ms": "120000",
                 "GPUSESSION_ADMIN_TOKEN": "admin", "SSH_AUTH_SOCK": "/tmp/agent", "PATH": "/root/bin"}
    env = node_environment(LAYOUT, "gpusvc", token="t0k", launcher_socket="/var/lib/gsh/launcher/socket/launcher.sock",
                           private_files=Path("/opt/gsh/private_files"), inherited=inherited)
    assert env["RAY_AUTH_TOKEN"] == "t0k" and env["RAY_AUTH_MODE"] == "token"
    assert env["GPUSESSION_LAUNCHER"] == "/var/lib/gsh/launcher/socket/launcher.sock"
    assert env["RAY_agent_register_timeout_ms"] == "120000"  # Ray's own tuning passes
    assert "RAY_ADDRESS" not in env and "GPUSESSION_ADMIN_TOKEN" not in env and "SSH_AUTH_SOCK" not in env
    assert env["HOME"] == env["GPUSESSION_HOME"] == "/var/lib/gsh/cluster" and env["USER"] == "gpusvc"
    assert env["RAY_TMPDIR"] == "/tmp/gsh-gpusvc" and env["PATH"].startswith("/opt/gsh/venv/bin")


def test_the_nodes_ray_gets_no_sigterm_drain_unless_the_command_sets_one():
    def env_of(inherited):
        return node_environment(LAYOUT, "gpusvc", token="t0k", launcher_socket="/l.sock",
                                private_files=Path("/p"), inherited=inherited)

    assert env_of({})["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env_of({"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "12"})["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "12"


def test_the_join_command_pipes_the_root_only_token_file_in():
    line = join_command(LAYOUT, "10.0.0.1:41234").splitlines()[0]
    assert line == "/opt/gsh/venv/bin/gpusession hub node --address 10.0.0.1:41234 --token-file - < " \
                   "/var/lib/gsh/hub/ray_token"


def test_the_token_comes_from_stdin():
    assert read_token("-", io.StringIO("abc123\n")) == "abc123"
    with pytest.raises(NodeFailed, match="nothing on stdin"):
        read_token("-", io.StringIO(""))


@pytest.mark.skipif(os.geteuid() != 0, reason="the accepted file is root's: run as root (CI does)")
def test_the_token_file_must_be_roots_alone(tmp_path):
    good = tmp_path / "ray_token"
    good.write_text("abc123\n")
    good.chmod(0o600)
    assert read_token(str(good), None) == "abc123"
    good.chmod(0o640)
    with pytest.raises(NodeFailed, match="only root may read"):
        read_token(str(good), None)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(NodeFailed, match="symbolic link is not followed"):
        read_token(str(link), None)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(NodeFailed, match="not a regular file"):
        read_token(str(fifo), None)
    empty = tmp_path / "empty"
    empty.write_text("")
    empty.chmod(0o600)
    with pytest.raises(NodeFailed, match="holds no token"):
        read_token(str(empty), None)


def test_a_node_that_did_not_join_names_the_error_line_of_its_log_not_the_traceback():
    log = ("Traceback (most recent call last):\n  File \"node.py\", line 996, in _init_gcs_client\n"
           "    raise RuntimeError(\nRuntimeError: Failed to connect to GCS.\n  File \"x.pyx\", line 3\n"
           "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing\n")
    assert last_error(log).startswith("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken")
    assert last_error("Ray runtime started.\n") is None


def test_a_node_sees_its_output_gone_only_once_a_pipes_or_sockets_reader_is_gone():
    reader, writer = os.pipe()
    with os.fdopen(writer, "w") as pipe:
        assert not output_gone(pipe)
        os.close(reader)  # sshd's end, once the admin's ssh ended
        assert output_gone(pipe)
    ours, theirs = socket.socketpair()
    with ours, ours.makefile("w") as stream:
        assert not output_gone(stream)
        theirs.close()
        assert output_gone(stream)
    with open(os.devnull, "w") as null:
        assert not output_gone(null)  # a file, /dev/null, a terminal: never gone
    assert not output_gone(io.StringIO())  # no descriptor behind it
