"""PURE: what `gpusession hub node` runs on a GPU machine that joins a hub's cluster, and the join
command the hub prints for admins. No process, file or user here.

On the node, as on the hub's own machine: root's launcher (gpusession/launcher/), started with a
clean environment, is the ranks' warm parent; the node's Ray (`ray start --address`) runs as the
service account, umask 077, in its own 0700 temporary directory, with GPUSESSION_LAUNCHER naming
that node's launcher (Ray's workers inherit it: the service's worker actors there ask it for ranks).
Ray's token reaches the node's Ray in its environment only: never on a command line, never in a
file another account can read.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from .plan import HubLayout, is_loopback

# `ray start` flags a node (not a head) takes: each server gets a free port, so the node starts
# beside any other Ray cluster on the machine (the head's client server and dashboard are the head's)
NODE_PORT_FLAGS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                   "--metrics-export-port", "--node-manager-port", "--object-manager-port")
# Ray's own settings the node command passes on from its environment; the address and the
# token it sets itself (the token comes only from --token-file)
NOT_PASSED_ON = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_TMPDIR")


@dataclass(frozen=True)
class NodeOptions:
    address: str  # the hub's Ray head, HOST:PORT, as the hub printed it
    token_file: str  # a file only root may read, or "-": Ray's token on stdin
    gpus: int  # logical GPUs when the machine has none
    node_ip: str | None  # this machine's address on the network the hosts share; None: Ray's choice
    min_uid: int  # the launcher starts no rank below this uid


def head_address(text: str) -> str:
    """HOST:PORT of the hub's Ray head; ValueError naming --address and what to write."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--address {text!r}: give the hub's Ray head as HOST:PORT, as `gpusession hub --ray-ip` "
                         "printed it (e.g. --address 10.0.0.1:41234).")
    if is_loopback(host.strip("[]")):
        raise ValueError(f"--address {text}: a loopback address is this machine, not the hub's: give the address "
                         "the hub printed after --ray-ip.")
    return text


def ray_ip_refusal(ip: str | None) -> str | None:
    """PURE: why --ray-ip (the hub's) or --node-ip (a node's) cannot be an address other hosts reach."""
    if ip is None:
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return f"{ip!r} is not an IP address: give this machine's address on the network the hosts share."
    if address.is_loopback or address.is_unspecified:
        return (f"{ip} is not an address other machines can reach: give this machine's address on the network "
                "the hosts share (e.g. 10.0.0.1).")
    return None


def ray_node_command(python: Path, options: NodeOptions, *, temp_dir: Path, real_gpus: int,
                     free_port: Callable[[], int]) -> list[str]:
    """The node's `ray start`, run as the service account (through hub/noderay.py)."""
    command = [str(python), "-m", "gpusession.hub.noderay", f"--address={options.address}", "--block",
               "--disable-usage-stats", f"--temp-dir={temp_dir / 'ray'}",
               *(f"{flag}={free_port()}" for flag in NODE_PORT_FLAGS), "--min-worker-port=0", "--max-worker-port=0"]
    if options.node_ip:
        command.append(f"--node-ip-address={options.node_ip}")
    if not real_gpus:
        command.append(f"--num-gpus={options.gpus}")
    return command


def node_environment(layout: HubLayout, account: str, *, token: str, launcher_socket: str, private_files: Path,
                     inherited: Mapping[str, str]) -> dict[str, str]:
    """The node's Ray environment: the service account's home, Ray's token, the node's launcher,
    the private-files sitecustomize (its workers use umask 077); Ray's own tuning (RAY_*) from
    the command's environment, nothing else of it.

    A SIGTERM stops the node at once, as it does the head (localhead): Ray's default drains for up
    to 30 s first, waiting for the node to fall idle, which a node holding gpusession's long-lived
    actors (its node host, spare workers) did not do: leaving took 30 s and then a SIGKILL. A
    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of the command's own is kept."""
    from ..launcher.__main__ import ENV as LAUNCHER_ENV

    tuning = {key: value for key, value in inherited.items()
              if key.startswith("RAY_") and key not in NOT_PASSED_ON}
    return {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **tuning, "PATH": f"{layout.bin_dir}:/usr/bin:/bin", "HOME": str(layout.cluster_dir), "LANG": "C.UTF-8",
            "USER": account, "GPUSESSION_HOME": str(layout.cluster_dir), "RAY_TMPDIR": str(layout.ray_tmp),
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
            LAUNCHER_ENV: launcher_socket, "PYTHONPATH": str(private_files)}


def join_command(layout: HubLayout, address: str) -> str:
    """What the hub prints: the command each GPU node runs as root, Ray's token on its stdin."""
    gpusession = layout.bin_dir / "gpusession"
    return (f"{gpusession} hub node --address {address} --token-file - < {layout.ray_token_path}\n"
            f"  (on each GPU node, as root, with Ray's token of this start on its stdin: e.g. "
            f"`ssh root@NODE {gpusession} hub node --address {address} --token-file - < {layout.ray_token_path}`; "
            f"run `scripts/setup --hub` there first; the same accounts must exist on every node)")
