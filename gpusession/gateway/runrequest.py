"""PURE: the run session's requests, checked field by field on the service's side (BadRunMessage
names the field that is wrong): a one-call `run` (hosted.py), a held lease's `lease` and the
`run`s made on it (heldlease.py). Options are validated again as gs.distributed validates them,
and refused where they would reach into the service itself (runtime_env)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..run.caller.options import for_held_lease
from . import keeping
from .frames import Message
from .runwire import BadRunMessage, options_from_json

MAX_NAME = 200


@dataclass(frozen=True)
class Call:
    """A function call as a kernel sent it: its name, the kernel's directory, the pickle and its buffers."""

    name: str
    cwd: str
    header: bytes
    buffers: list


@dataclass(frozen=True)
class RunRequest:
    name: str
    cwd: str
    options: Any  # RunOptions, validated here
    header: bytes
    buffers: list
    checkpoint: str | None
    checkpoint_step: Any
    asking: dict
    detach: float | None = None  # a detached run's max_duration (s); None: the run ends with its connection


@dataclass(frozen=True)
class LeaseRequest:
    """gs.lease(...) through the gateway: GPUs held for several runs while the connection lives."""

    options: Any  # RunOptions, validated here; `timeout` bounds each run, not the lease
    asking: dict


def call_of(message: Message) -> Call:
    """The call a `run` message carries (its payload: the pickle, then `buffers` raw frames)."""
    name, cwd = message.get("name"), message.get("cwd")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise BadRunMessage(f"name must be the function's name (1 to {MAX_NAME} characters)")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        raise BadRunMessage("cwd must be the kernel's working directory, an absolute path")
    count = message.get("buffers")
    if isinstance(count, bool) or not isinstance(count, int) or count != len(message.payload) - 1:
        raise BadRunMessage("buffers must be the number of payload frames after the call's pickle")
    return Call(name, cwd, message.payload[0], list(message.payload[1:]))


def options_of(message: Message) -> Any:
    """The message's options as gs.distributed validates them; runtime_env refused."""
    options = options_from_json(message.get("options"))
    if options.runtime_env:
        raise BadRunMessage(
            "runtime_env is not available through the gateway: under the hub it would configure the service's own "
            "worker processes (their environment, their code); ask an admin to install what the function needs. "
            "A detached run outside the hub goes through your own gateway, which refuses it too: install what it "
            "needs where the cluster's workers run, or submit without detach=True")
    return options


def asking_of(message: Message) -> dict:
    """The labels the sidebar shows for the request (the broker checks each one again)."""
    asking = message.get("asking", {})
    if not isinstance(asking, dict):
        raise BadRunMessage("asking must be an object {notebook, cell_id, background}")
    return {k: asking.get(k) for k in ("notebook", "cell_id", "background")}


def run_request(message: Message, default_max_duration_s: float = keeping.DEFAULT_MAX_DURATION_S) -> RunRequest:
    """A `run` message that begins a run session (one call, leased for it)."""
    call = call_of(message)
    checkpoint = message.get("checkpoint")
    if checkpoint is not None and not isinstance(checkpoint, str):
        raise BadRunMessage("checkpoint must be a handle the gateway gave, or null")
    step = message.get("checkpoint_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float))):
        raise BadRunMessage("checkpoint_step must be a number or null")
    asking = asking_of(message)
    options = options_of(message)
    detach = keeping.detach_from_json(message.get("detach"), default_max_duration_s)
    return RunRequest(call.name, call.cwd, options, call.header, call.buffers, checkpoint, step, asking, detach)


def lease_request(message: Message) -> LeaseRequest:
    """A `lease` message: the options of gs.lease (those of gs.distributed) and the labels."""
    return LeaseRequest(for_held_lease(options_of(message)), asking_of(message))
