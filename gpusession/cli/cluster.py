"""`gpusession cluster start|stop|status`: the local Ray head outside Jupyter.

    $ gpusession cluster start --gpus 4
    Started local Ray head at 192.0.2.2:40213: 4 logical GPUs (training runs on the CPU), ...
    Kernels and scripts on this machine now use it (GPUSESSION_HOME/local-head.json).
"""
from __future__ import annotations

import argparse
import sys

from .argtypes import seconds

# localhead imports Ray (seconds): only the cluster commands themselves load it, not every
# `gpusession` command that registers them.


def register(subparsers) -> None:
    """Add `cluster start|stop|status` to the `gpusession` CLI; each command's handler returns an exit code."""
    cluster = subparsers.add_parser(
        "cluster", help="start, stop or inspect the local Ray head on this machine",
        description="Manage the local Ray head (`ray start --head`) that gpusession on this machine uses.",
    )
    commands = cluster.add_subparsers(dest="cluster_command", metavar="{start,stop,status}", required=True)
    start = commands.add_parser(
        "start", help="start a local Ray head in the background",
        description="Start a Ray head on this machine in the background and record its address in "
                    "GPUSESSION_HOME/local-head.json, where kernels, scripts and `jupyter lab` find it.",
    )
    start.add_argument("--gpus", type=_positive, default=None, metavar="N",
                       help="logical GPUs to declare when the machine has none (default 4); "
                            "ignored on a machine with real GPUs, which are all used")
    start.add_argument("--timeout", type=seconds, default=120.0, metavar="S",
                       help="seconds to wait for the head to come up (default 120)")
    start.set_defaults(handler=_start)
    stop = commands.add_parser("stop", help="stop the local Ray head started by `cluster start`",
                               description="Stop the recorded local Ray head and every Ray process it runs.")
    stop.set_defaults(handler=_stop)
    status = commands.add_parser("status", help="show whether a local Ray head is running, and where",
                                 description="Show the recorded local Ray head; exit status 1 if none runs.")
    status.set_defaults(handler=_status)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs such as 4; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, at least 1 (such as 4); got {value}")
    return value


def _start(args: argparse.Namespace) -> int:
    from ..cluster import localhead
    from ..cluster.raycluster import local_head_file

    try:
        head, started = localhead.start(gpus=args.gpus, timeout_s=args.timeout)
    except localhead.LocalHeadError as exc:
        print(exc)
        return 1
    if not started:
        print(f"Already running: {head.describe()}. Stop it with `gpusession cluster stop`.")
        return 0
    print(f"Started {head.describe()}.")
    print(f"Kernels and scripts on this machine now use it ({local_head_file()}).")
    print("Other Ray clients join it with: " + " ".join(f"{k}={v}" for k, v in head.client_env().items()))
    return 0


def _stop(args: argparse.Namespace) -> int:
    from ..cluster import localhead
    from ..cluster.raycluster import local_head_file

    stopped = localhead.stop()
    if stopped is None:
        print(f"No local Ray head is recorded in {local_head_file()}; nothing to stop.")
        return 0
    head, was_running = stopped
    if was_running:
        print(f"Stopped the local Ray head at {head.address} (pid {head.pid}).")
    else:
        print(f"The local Ray head recorded at {head.address} (pid {head.pid}) was no longer running; "
              f"removed its record.")
    return 0


def _status(args: argparse.Namespace) -> int:
    from ..cluster import localhead

    head = localhead.status()
    if head is None:
        print("No local Ray head is running. Start one with `gpusession cluster start`.")
        return 1
    print(f"Running: {head.describe()}.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run only the `cluster` commands (`python -m gpusession.cli.cluster status`)."""
    parser = argparse.ArgumentParser(prog="gpusession")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cluster", *(argv if argv is not None else sys.argv[1:])])
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
