"""`gpusession runs list|cancel`: the detached runs the gpusession gateway keeps, from a shell.

`list` shows this account's (what `gs.runs(all=True)` returns in a kernel); `--every-user`,
every account's, which the gateway answers for its admins only (the hub's, `gpusession hub
--admin`): how an admin finds the id of another user's run to `cancel` it. The gateway asked is
the hub's (GPUSESSION_GATEWAY, set in the hub's terminals and kernels), else this user's own for
the cluster of RAY_ADDRESS or `gpusession cluster start` (it runs only once a detach started it).
Imports no Ray.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re

from . import tables

COLUMNS = ("run_id", "user", "name", "state", "gpus", "started", "ended", "end_reason", "expires")
TIMES = ("started", "ended", "expires")
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def register(sub) -> None:
    runs = sub.add_parser("runs", help="detached runs the gateway keeps (yours; every account's for an admin)",
                          description="Detached runs (submit(detach=True), %%gpu --detach): they outlive the "
                                      "kernel; the gateway keeps their records for its retention after they end.")
    verbs = runs.add_subparsers(title="actions", metavar="ACTION")
    listing = verbs.add_parser("list", help="detached runs, newest first: yours, or every account's (--every-user)")
    listing.add_argument("--every-user", action="store_true",
                         help="every account's runs (an admin of the hub's gateway only)")
    listing.add_argument("--json", action="store_true", help="print JSON (times as Unix seconds) instead of a table")
    listing.set_defaults(handler=_list)
    cancel = verbs.add_parser("cancel", help="stop a detached run (its owner, or an admin): its GPUs are released",
                              epilog="Example: gpusession runs cancel 0f3c6a9e2b7d4e1f8a5c3b2d1e0f9a8b")
    cancel.add_argument("run_id", type=_run_id, metavar="RUN_ID", help="the run's id (see `gpusession runs list`)")
    cancel.set_defaults(handler=_cancel)
    runs.set_defaults(handler=lambda args: runs.print_help() or 2)


def _run_id(text: str) -> str:
    if not RUN_ID.match(text):
        raise argparse.ArgumentTypeError(f"expected a run id, 32 hexadecimal digits (see `gpusession runs list`); "
                                         f"got {text[:40]!r}")
    return text


def listed_rows(every_user: bool) -> list[dict]:
    """The gateway's rows (run_id, name, user, state, gpus, started, ended, expires, ...), newest
    first. Yours: none when no gateway keeps runs for you here. Every account's: the hub's
    gateway's answer (NotAuthorized unless you are one of its admins); an error without one."""
    from ..errors import GPUSessionError
    from ..cluster.where import GATEWAY_ENV
    from ..gateway.client import connect, gateway_path
    from ..gateway.kinds import Kind
    from ..gateway.runwire import error_from_json
    from ..gateway.usergateway import NoUserGateway, detached_gateway

    if every_user:  # a user's own gateway keeps that user's runs alone and names no admin
        path = gateway_path()
        if not path:
            raise GPUSessionError(f"--every-user asks the hub's gateway, and this shell reaches none ({GATEWAY_ENV} "
                                  "is unset; the hub sets it in its terminals and kernels). Run it in a terminal "
                                  "of your Jupyter server on the hub, as one of the hub's admins.")
    else:
        try:
            path = detached_gateway("gpusession runs list")
        except NoUserGateway:  # nothing keeps a run of yours here
            return []
    conn, _ = connect("run", path)
    try:
        conn.send(Kind.LIST, every_user=every_user)
        answer = conn.receive()
    finally:
        conn.close()
    if answer.kind != Kind.RUNS:
        raise error_from_json(answer.get("error"))
    return list(answer.get("runs") or [])


def table(rows: list[dict]) -> str:
    """PURE: the rows as a text table, times as local YYYY-MM-DD HH:MM:SS."""
    return tables.table([{**row, **{column: _clock(row.get(column)) for column in TIMES}} for row in rows], COLUMNS)


def _clock(seconds) -> str | None:
    return dt.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S") if isinstance(seconds, (int, float)) else None


def _list(args) -> int:
    rows = listed_rows(args.every_user)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


def _cancel(args) -> int:
    from ..gateway.reattach import cancel_run

    if cancel_run(args.run_id):
        print(f"detached run {args.run_id}: cancelling (every worker stops and its GPUs are released)")
    else:
        print(f"detached run {args.run_id} had already ended; nothing to stop")
    return 0
