"""`gpusession hub`'s command line: options (and an optional JSON config file) to a plan, then run."""
from __future__ import annotations

import argparse
import json
import math
import socket
from pathlib import Path

from ..gateway.intake import size_of
from ..gateway.keeping import detach_policy
from ..run.caller.options import parse_duration
from .nodeplan import NodeOptions, head_address, ray_ip_refusal
from .plan import (DEFAULT_CULL_IDLE_AFTER_S, DEFAULT_PREFIX, DEFAULT_SERVICE_USER, DEFAULT_STATE,
                   MIN_CULL_IDLE_AFTER_S, Culling, HubLayout, HubOptions, listen_refusal)

QUICK_START = """quick start (as root, on the GPU machine):
  scripts/setup --hub && useradd -m alice && passwd alice
  gpusession hub --admin alice          # then open the URL it prints and log in as alice"""
CONFIG_KEYS = {"admins": "user names, e.g. [\"alice\"]", "default_quota": "e.g. {\"max_gpus\": 2}",
               "allow_borrowing": "true or false: whether users may run past max_gpus on idle GPUs"}


def register(subparsers) -> None:
    hub = subparsers.add_parser(
        "hub", help="a JupyterHub for a team on this machine: one server per Unix user, one shared cluster",
        description="Start JupyterHub (PAM logins, each user's server run as that Unix user) in front of one "
                    "Ray head and broker run by a service account, with gpusession in every user's server. "
                    "Runs as root. Ctrl-C stops the users' servers, then the cluster.",
        epilog=QUICK_START, formatter_class=argparse.RawDescriptionHelpFormatter)
    hub.add_argument("--admin", action="append", default=[], metavar="USER",
                     help="a gpusession and JupyterHub admin (repeat for several)")
    hub.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help='JSON file with "admins", "default_quota" (the quota of users without their own) and '
                         '"allow_borrowing"')
    hub.add_argument("--ip", default="127.0.0.1",
                     help="address the Hub listens on (default 127.0.0.1: this machine only; reach it through an "
                          "SSH tunnel or a TLS proxy). Any other address needs --ssl-cert and --ssl-key, or "
                          "--insecure-http")
    hub.add_argument("--ssl-cert", type=Path, default=None, metavar="FILE",
                     help="the Hub's TLS certificate (PEM); with --ssl-key the Hub serves HTTPS")
    hub.add_argument("--ssl-key", type=Path, default=None, metavar="FILE", help="the private key of --ssl-cert (PEM)")
    hub.add_argument("--insecure-http", action="store_true",
                     help="serve plain HTTP on a non-loopback --ip anyway: Unix passwords then cross the network "
                          "in clear text (a warning says so at every start)")
    hub.add_argument("--port", type=_port, default=8000, help="the Hub's port, 1-65535 (default 8000)")
    _add_machine_options(hub, state="the ledger, secrets, JupyterHub's database and logs",
                         service="the account that runs Ray and the broker")
    hub.add_argument("--cull-idle-after", type=_idle_after, default=None, metavar="TIME",
                     help="stop a user's server after this long without activity: seconds or e.g. 30m, 2h, at "
                          f"least {MIN_CULL_IDLE_AFTER_S} s (default 1h; jupyterhub-idle-culler). A live run of "
                          "one of its kernels counts as activity; a detached run goes on when its server stops")
    hub.add_argument("--no-cull", action="store_true",
                     help="run no idle culler: users' servers run until their users (or an admin) stop them")
    hub.add_argument("--no-run-activity", action="store_true",
                     help="do not count a live run as its server's activity: a server with a run going is then "
                          "culled when Jupyter itself sees no activity (requests, terminals, kernel messages; a "
                          "notebook's live view of a run sends some every second)")
    hub.add_argument("--detach-max-duration", default=None, metavar="TIME",
                     help="the time limit of a detached run that names none: seconds or e.g. 8h, 2d, at most 30 "
                          "days (default 24h); a call may ask for another up to 30 days")
    hub.add_argument("--detach-retention", default=None, metavar="TIME",
                     help="how long an ended detached run's result, metrics and output are kept in the gateway: "
                          "seconds or e.g. 3d, from 60 s to 365 days (default 7d)")
    hub.add_argument("--call-bytes-per-user", default=None, metavar="SIZE",
                     help="how much of the gateway's memory one account's calls (a function's pickle and its "
                          "arrays, before they are shipped into Ray's object store) may hold at a time: bytes or "
                          "e.g. 8G, 512M (default: a quarter of this machine's memory); a bigger call is refused "
                          "with QuotaExceeded, nothing leased")
    hub.add_argument("--ray-ip", default=None, metavar="ADDRESS",
                     help="this machine's address on the network the GPU nodes share: the Ray head advertises it, "
                          "Ray's token of each start is kept for root in STATE/hub/ray_token, and the hub prints the "
                          "`gpusession hub node` command other machines join with (default: one machine, no node "
                          "joins)")
    hub.add_argument("--temp-dir", type=Path, default=None, metavar="DIR",
                     help="Ray's temporary directory, made the service account's (0700): its logs and spilled "
                          "objects (default /tmp/gsh-SERVICE_USER; another local account that makes that folder "
                          "first keeps the hub from starting: give a folder in a root-owned place where local "
                          "accounts are not trusted)")
    hub.set_defaults(handler=_hub)
    _register_node(hub.add_subparsers(title="on the other GPU machines", metavar="node", dest="hub_command"))


def _add_machine_options(parser: argparse.ArgumentParser, *, state: str, service: str) -> None:
    """The options `gpusession hub` and `hub node` share: this machine's GPUs, install, state and accounts."""
    parser.add_argument("--gpus", type=_gpus, default=4, metavar="N",
                        help="logical GPUs when the machine has none, at least 1 (default 4); a machine's real GPUs "
                             "are all used")
    parser.add_argument("--prefix", type=Path, default=DEFAULT_PREFIX,
                        help=f"where scripts/setup --hub installed the hub's environment (default {DEFAULT_PREFIX})")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help=f"{state} (default {DEFAULT_STATE})")
    parser.add_argument("--service-user", default=DEFAULT_SERVICE_USER,
                        help=f"{service}, made if missing (default {DEFAULT_SERVICE_USER})")
    parser.add_argument("--min-uid", type=_min_uid, default=1000, metavar="UID",
                        help="the lowest uid whose ranks the launcher starts; system accounts lie below (default 1000)")


def _register_node(subparsers) -> None:
    node = subparsers.add_parser(
        "node", help="join this GPU machine to a hub's cluster (as root, on each extra node)",
        description="Join a `gpusession hub --ray-ip ...` cluster: start root's launcher (each rank runs as its "
                    "user, so the same accounts must exist on every node), then this machine's Ray node as the "
                    "service account. Runs as root; Ctrl-C (or SIGTERM, SIGHUP) leaves the cluster and stops both.",
        epilog=NODE_QUICK_START, formatter_class=argparse.RawDescriptionHelpFormatter)
    node.add_argument("--address", required=True, type=_head_address, metavar="HOST:PORT",
                      help="the hub's Ray head, as `gpusession hub --ray-ip` printed it")
    node.add_argument("--token-file", required=True, metavar="FILE",
                      help="Ray's token of the hub's current start: a file of root's, mode 0600 (never a command "
                           "line argument), or - to read it from stdin")
    node.add_argument("--node-ip", default=None, metavar="ADDRESS",
                      help="this machine's address on the network the hosts share (default: Ray's choice)")
    _add_machine_options(node, state="this node's logs and the service account's directory",
                         service="the hub's service account")
    node.add_argument("--temp-dir", type=Path, default=None, metavar="DIR",
                      help="Ray's temporary directory on this node, made the service account's (0700) "
                           "(default /tmp/gsh-SERVICE_USER)")
    node.set_defaults(handler=_node)


NODE_QUICK_START = """example (as root on each extra GPU node, after scripts/setup --hub there):
  gpusession hub node --address 10.0.0.1:41234 --token-file - < ray_token
  (the hub with --ray-ip prints this line, and keeps ray_token in STATE/hub/, root's alone)"""


def node_options_from(args: argparse.Namespace) -> tuple[HubLayout, NodeOptions]:
    """The layout and options of `gpusession hub node`; ValueError names the bad field."""
    refusal = ray_ip_refusal(args.node_ip)
    if refusal:
        raise ValueError(f"--node-ip {refusal}")
    layout = HubLayout(args.prefix, args.state_dir, args.service_user, args.temp_dir)
    return layout, NodeOptions(args.address, args.token_file, args.gpus, args.node_ip, args.min_uid)


def _head_address(text: str) -> str:
    try:
        return head_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def options_from(args: argparse.Namespace) -> tuple[HubLayout, HubOptions]:
    """The layout and options the arguments ask for; ValueError names the bad field."""
    config = _read_config(args.config) if args.config else {}
    admins = tuple(sorted({*args.admin, *config.get("admins", [])}))
    policy = {key: config[key] for key in ("default_quota", "allow_borrowing") if key in config}
    refusal = listen_refusal(args.ip, args.ssl_cert, args.ssl_key, args.insecure_http)
    if refusal:
        raise ValueError(refusal)
    ray_ip = ray_ip_refusal(args.ray_ip)
    if ray_ip:
        raise ValueError(f"--ray-ip {ray_ip}")
    for flag, path in (("--ssl-cert", args.ssl_cert), ("--ssl-key", args.ssl_key)):
        if path is not None and not path.is_file():
            raise ValueError(f"{flag} {path}: no such file. Give the path of a PEM file.")
    detach = detach_policy(args.detach_max_duration, args.detach_retention)
    call_bytes = None if args.call_bytes_per_user is None else size_of(args.call_bytes_per_user)
    layout = HubLayout(args.prefix, args.state_dir, args.service_user, args.temp_dir)
    return layout, HubOptions(args.ip, args.port, admins, args.gpus, _free_port(), _free_port(), policy,
                              ssl_cert=args.ssl_cert, ssl_key=args.ssl_key, insecure_http=args.insecure_http,
                              min_uid=args.min_uid, culling=culling_from(args), ray_ip=args.ray_ip, detach=detach,
                              call_bytes=call_bytes)


def culling_from(args: argparse.Namespace) -> Culling:
    """The culler's settings the arguments ask for; ValueError when they contradict each other."""
    if args.no_cull and args.cull_idle_after is not None:
        raise ValueError("--no-cull and --cull-idle-after contradict each other: keep one (--no-cull runs no "
                         "culler; --cull-idle-after sets when it stops an idle server).")
    idle_after = 0 if args.no_cull else (args.cull_idle_after or DEFAULT_CULL_IDLE_AFTER_S)
    return Culling(idle_after_s=idle_after, run_activity=not args.no_run_activity)


def _idle_after(text: str) -> int:
    try:
        seconds = parse_duration(text, field_name="--cull-idle-after")
    except ValueError:
        seconds = None
    if seconds is None or seconds < MIN_CULL_IDLE_AFTER_S:
        raise argparse.ArgumentTypeError(
            f"must be a time of at least {MIN_CULL_IDLE_AFTER_S} seconds, in seconds or e.g. 30m, 2h; got {text!r}. "
            "To run no culler, use --no-cull.")
    return math.ceil(seconds)


def _min_uid(text: str) -> int:
    value = _whole(text, "a uid")
    if value < 1:
        raise argparse.ArgumentTypeError(f"--min-uid {text}: the launcher never starts a rank as root (uid 0); "
                                         "give 1 or more (default 1000).")
    return value


def _port(text: str) -> int:
    value = _whole(text, "a port number")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535; got {value}")
    return value


def _gpus(text: str) -> int:
    value = _whole(text, "a number of GPUs")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (the logical GPUs to offer); got {value}")
    return value


def _whole(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, a whole number; got {text!r}") from None


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--config {path}: cannot read it as JSON ({exc}).") from None
    unknown = sorted(set(config) - set(CONFIG_KEYS)) if isinstance(config, dict) else ["(not an object)"]
    if unknown:
        known = "; ".join(f"{k}: {v}" for k, v in CONFIG_KEYS.items())
        raise ValueError(f"--config {path}: unknown field {unknown[0]!r}; the fields are {known}.")
    admins = config.get("admins", [])
    if not isinstance(admins, list) or not all(isinstance(a, str) and a for a in admins):
        raise ValueError(f"--config {path}: admins must be a list of user names, e.g. [\"alice\"].")
    if not isinstance(config.get("allow_borrowing", False), bool):
        raise ValueError(f"--config {path}: allow_borrowing must be true or false.")
    return config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hub(args: argparse.Namespace) -> int:
    from .run import run_hub, say

    try:
        layout, options = options_from(args)
    except ValueError as exc:
        say(str(exc))
        return 2
    return run_hub(layout, options)


def _node(args: argparse.Namespace) -> int:
    from .node import run_node, say

    try:
        layout, options = node_options_from(args)
    except ValueError as exc:
        say(str(exc))
        return 2
    return run_node(layout, options)
