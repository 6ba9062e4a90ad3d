"""`gpusession ...`: the demo, JupyterLab, and the broker's user and admin operations from a shell."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys

from ..broker.policy.states import LeaseState
from .argtypes import seconds
from .tables import table
from ..errors import GPUSessionError

ADMIN_TOKEN_ENV = "GPUSESSION_ADMIN_TOKEN"
NO_CLUSTER = ("No running Ray cluster: start one with `gpusession cluster start` (or `ray start --head`) "
              "and/or set RAY_ADDRESS.")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_together(parser, args)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args) or 0
    except (GPUSessionError, ValueError) as exc:
        print(f"gpusession: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusession", description="Lease GPUs from a Ray cluster only while code runs.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run examples/quickstart.ipynb headless on the embedded default cluster",
                          description="Execute the quickstart notebook in a fresh kernel (its own local Ray head, "
                                      "logical GPUs when the machine has none) and print its results and receipt.")
    demo.add_argument("--notebook", type=_notebook_file, help="notebook to run instead of the quickstart")
    demo.add_argument("--timeout", type=seconds, default=600, help="seconds a cell may take (default 600)")
    demo.set_defaults(handler=_demo)

    lab = sub.add_parser("lab", help="JupyterLab with gpusession and its embedded cluster (prints the URL)",
                         description="Start JupyterLab with the gpusession extension. With no RAY_ADDRESS it starts a "
                                     "local Ray head and the broker (logical GPUs when the machine has none), "
                                     "prints the URL once JupyterLab answers, and stops everything on Ctrl-C. "
                                     "Runs as root too (passes --allow-root).",
                         epilog="Example: gpusession lab --no-browser --port 8890 -- --ServerApp.base_url=/gpus/")
    lab.add_argument("--port", type=_port, default=None, help="port (default 8888, or a free one if 8888 is taken)")
    lab.add_argument("--ip", default="localhost", help="address to listen on (default localhost; 0.0.0.0 for all)")
    lab.add_argument("--gpus", type=_gpus, default=None, metavar="N",
                     help="logical GPUs of the embedded cluster when the machine has none (default 4)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.add_argument("--notebook-dir", type=_folder, default=None,
                     help="folder JupyterLab shows (default: the current one)")
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, metavar="-- JUPYTER_OPTIONS",
                     help="more options for JupyterLab, after --")
    lab.set_defaults(handler=_lab)

    status = sub.add_parser("status", help="cluster capacity, your quota and your leases")
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.set_defaults(handler=_status)

    leases = sub.add_parser("leases", help="active and queued leases (yours; everyone's with the admin token)")
    leases.add_argument("--all", action="store_true", help="include ended leases (the ledger's newest 200)")
    leases.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _admin_option(leases)
    leases.set_defaults(handler=_leases)

    revoke = sub.add_parser("revoke", help="revoke a lease (its owner or an admin)",
                            description="Notify the lease's caller, which stops its workers and releases; "
                                        "after a grace period the broker takes the GPUs back by force.")
    revoke.add_argument("lease_id", type=_lease_id, metavar="ID", help="the lease id (see `gpusession leases`)")
    _admin_option(revoke)
    revoke.set_defaults(handler=_revoke)

    _add_quota(sub)
    from .runs import register as register_runs  # the gateway's modules load only when a verb runs

    register_runs(sub)

    usage = sub.add_parser("usage", help="GPU-hours per user (or per user and day)")
    usage.add_argument("--since", type=_date, help="start, YYYY-MM-DD or ISO time (default: 7 days ago)")
    usage.add_argument("--until", type=_date, help="end, YYYY-MM-DD or ISO time (default: now)")
    usage.add_argument("--by", choices=("user", "day"), default="user", help="group by user, or by user and day")
    usage.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _admin_option(usage)
    usage.set_defaults(handler=_usage)

    try:
        from .cluster import register
    except ImportError:  # the local-head commands ship with the Jupyter extension's module
        register = None
    if register is not None:
        register(sub)
    from ..hub.cli import register as register_hub  # argparse only: the hub's machinery loads when it runs

    register_hub(sub)
    return parser


def _add_quota(sub) -> None:
    quota = sub.add_parser("quota", help="read or change per-user quotas (changes need the admin token)")
    verbs = quota.add_subparsers(title="actions", metavar="ACTION")
    listing = verbs.add_parser("list", help="every user with a quota row or a lease")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _admin_option(listing)
    listing.set_defaults(handler=_quota_list)
    get = verbs.add_parser("get", help="one user's quota and usage")
    get.add_argument("user", type=_user)
    get.add_argument("--json", action="store_true", help="print JSON")
    _admin_option(get)
    get.set_defaults(handler=_quota_get)
    change = verbs.add_parser("set", help="set one user's quota (fields not given keep their value)",
                              epilog="Example: gpusession quota set alice --max-gpus 2 --gpu-hours 40 --max-priority high")
    change.add_argument("user", type=_user)
    # SUPPRESS: a flag not given leaves no attribute, so "--max-gpus none" (no limit) differs from absent
    change.add_argument("--max-gpus", type=_limit, default=argparse.SUPPRESS,
                        help="GPUs held at once; 'none' for no limit")
    change.add_argument("--gpu-hours", type=_limit, default=argparse.SUPPRESS,
                        help="GPU-hours per rolling 7 days; 'none' for unlimited")
    change.add_argument("--max-priority", type=str.lower, choices=("low", "normal", "high"), default=argparse.SUPPRESS,
                        help="highest priority allowed")
    _admin_option(change)
    change.set_defaults(handler=_quota_set)
    reset = verbs.add_parser("reset", help="remove the user's row: the default quota applies again")
    reset.add_argument("user", type=_user)
    _admin_option(reset)
    reset.set_defaults(handler=_quota_reset)
    quota.set_defaults(handler=lambda args: quota.print_help() or 2)


def _admin_option(parser) -> None:
    parser.add_argument("--admin-token", default=os.environ.get(ADMIN_TOKEN_ENV),
                        help=f"the broker's admin token (default: ${ADMIN_TOKEN_ENV}, else the token file "
                             "beside the ledger when this machine can read it)")


def _limit(text: str) -> float | None:
    if text.strip().lower() in ("none", "null", "unlimited"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (e.g. 2 or 0.5) or 'none' for no limit, "
                                         f"got {text!r}")
    return value


def _date(text: str) -> float:
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD or an ISO time such as 2024-06-01T12:00, "
                                         f"got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _whole(text: str, *, low: int, high: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected {what}, a whole number from {low} to {high}; got {text!r}")
    return value


def _lease_id(text: str) -> int:
    return _whole(text, low=1, high=2**62, what="a lease id (see `gpusession leases`)")


def _port(text: str) -> int:
    return _whole(text, low=1, high=65535, what="a TCP port such as 8890")


def _gpus(text: str) -> int:
    return _whole(text, low=1, high=1024, what="a number of logical GPUs such as 4")


def _user(text: str) -> str:
    if not text or len(text) > 256 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected a user name of 1-256 printable characters; got {text[:40]!r}")
    return text


def _notebook_file(text: str) -> str:
    if not text.endswith(".ipynb") or not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"expected the path of an existing .ipynb file; got {text!r}")
    return text


def _folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected an existing folder; {text!r} is not one")
    return text


def _check_together(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options valid alone but not together: refused like argparse's own errors (exit status 2)."""
    since, until = getattr(args, "since", None), getattr(args, "until", None)
    if since is not None and until is not None and since > until:
        parser.error(f"argument --since: {dt.datetime.fromtimestamp(since, dt.timezone.utc):%Y-%m-%d %H:%M} is "
                     f"after --until ({dt.datetime.fromtimestamp(until, dt.timezone.utc):%Y-%m-%d %H:%M}); "
                     "swap them")


# ----- talking to the broker ------------------------------------------------------------------------
def _broker(args):
    """The quickest way to this cluster's broker: a gpusession Jupyter server of this user on it
    (see cli_access), else Ray. Imports nothing heavy until it knows which."""
    from . import access as cli_access
    from ..gateway.client import gateway_path

    if gateway_path() and not getattr(args, "admin_token", None):  # a hub user: the gateway is the one door
        return cli_access.GatewayAccess(gateway_path())
    address = cli_access.target_address()
    # an admin token (flag or environment) means acting as its holder: only the Ray path can
    server = None if getattr(args, "admin_token", None) else cli_access.find_server(address)
    if server is not None:
        return cli_access.ServerAccess(server)
    return _ray_access(args)


def _ray_access(args):
    from . import access as cli_access
    from ..cluster import raycluster

    if not (os.environ.get("RAY_ADDRESS") or raycluster.recorded_local_head()):
        raise GPUSessionError(NO_CLUSTER)
    return cli_access.RayAccess(getattr(args, "admin_token", None))


def _print(data, args, render) -> None:
    print(json.dumps(data, indent=2, default=str) if getattr(args, "json", False) else render(data))


def _status(args) -> int:
    from ..api.status import Status

    data = _status_quickly(args) or _broker(args).status()
    result = Status(user=data["user"], cluster=data["cluster"], quota=data["quota"], leases=data["leases"])
    _print(result.__dict__, args, lambda _: str(result))
    return 0


def _status_quickly(args) -> dict | None:
    """`status` from the broker's endpoint on this head when no server of this user runs here;
    None when neither answers (then Ray's path, which also takes the admin token, is used)."""
    from . import access as cli_access
    from ..gateway.client import gateway_path

    address = cli_access.target_address()
    if getattr(args, "admin_token", None) or gateway_path() or cli_access.find_server(address):
        return None
    access = cli_access.EndpointAccess.find(address)
    try:
        return access.status() if access else None
    except cli_access.EndpointGone:
        return None


def _leases(args) -> int:
    rows = _broker(args).leases(args.all)
    _print(rows, args, lambda rows: table(rows, ("lease_id", "user", "gpus", "priority", "state", "over_quota",
                                                 "position", "age_s", "end_reason", "gpu_seconds", "sweep_id")))
    return 0


def _revoke(args) -> int:
    view = _broker(args).revoke(args.lease_id)
    print(f"lease {view['lease_id']} of {view['user']}: {view['state']}"
          + (" (notified; it stops within the grace period)" if view["state"] != LeaseState.ENDED else ""))
    return 0


def _quota_list(args) -> int:
    rows = _broker(args).quotas()
    _print(rows, args, lambda rows: table(rows, ("user", "max_gpus", "gpu_hours", "max_priority",
                                                 "gpus_in_use", "gpu_hours_7d", "is_default")))
    return 0


def _quota_get(args) -> int:
    row = _broker(args).quota(args.user)
    _print(row, args, lambda row: table([row], ("user", "max_gpus", "gpu_hours", "max_priority",
                                                 "gpus_in_use", "gpu_hours_7d", "is_default")))
    return 0


def _quota_set(args) -> int:
    update = {f: getattr(args, f) for f in ("max_gpus", "gpu_hours", "max_priority") if hasattr(args, f)}
    if not update:
        raise ValueError("give at least one of --max-gpus, --gpu-hours, --max-priority.")
    row = _broker(args).set_quota(args.user, update)
    print(table([row], ("user", "max_gpus", "gpu_hours", "max_priority", "gpus_in_use", "gpu_hours_7d")))
    return 0


def _quota_reset(args) -> int:
    row = _broker(args).reset_quota(args.user)
    print(f"{row['user']} now has the default quota:")
    print(table([row], ("user", "max_gpus", "gpu_hours", "max_priority")))
    return 0


def _usage(args) -> int:
    rows = _broker(args).usage(args.since, args.until, args.by)
    for row in rows:
        row["gpu_hours"] = round(row["gpu_seconds"] / 3600.0, 4)
    columns = ("user", "day", "gpu_hours") if args.by == "day" else ("user", "gpu_hours")
    _print(rows, args, lambda rows: table(rows, columns))
    return 0


def _lab(args) -> int:
    from .lab import run_lab

    extra = [a for a in args.jupyter_args if a != "--"]
    return run_lab(port=args.port, ip=args.ip, gpus=args.gpus, open_browser=not args.no_browser,
                   notebook_dir=args.notebook_dir, extra=extra)


def _demo(args) -> int:
    from .demo import run_demo

    return run_demo(notebook=args.notebook, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
