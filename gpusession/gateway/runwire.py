"""PURE: what the run session's messages hold, as JSON (never a pickle): a call's options, a run's
RunInfo, an Observer event, an error. Both sides use it: the kernel encodes options and decodes
events and errors; the service decodes (and re-validates) options and encodes the rest.

A user's function, arguments and result never pass through here: they travel as raw frames.
"""
from __future__ import annotations

import dataclasses
import math
import re
from numbers import Real
from typing import Any

from .. import errors
from ..run.comm_options import CommOptions, CommReport, Compression, validate_comm_options
from ..observe.events import RunInfo
from ..run.caller.options import RunOptions, validate_run_options
from .kinds import StopReason

SWEEP_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
QUALIFIED_NAME = re.compile(r"^[A-Za-z_][\w.]{0,300}$")


class BadRunMessage(ValueError):
    """A run message whose fields are not what the protocol says (the connection is ended)."""


# ----- options -------------------------------------------------------------------------------------
def options_to_json(options: RunOptions) -> dict:
    """A validated RunOptions as the keyword arguments of validate_run_options (plain JSON),
    plus what a sweep sets itself (sweep_id) and retry_exceptions as qualified class names."""
    lease, comm = options.lease, options.comm
    if options.runtime_env is not None:
        _require_json(options.runtime_env, "runtime_env")
    return {
        "gpus": lease.gpus, "gpus_per_worker": lease.gpus_per_worker, "min_gpus": lease.min_gpus,
        "priority": lease.priority.label, "placement": lease.placement.value,
        "queue_timeout": lease.queue_timeout_s, "timeout": options.timeout_s, "backend": options.backend,
        "max_failures": options.max_failures, "return_all": options.return_all,
        "runtime_env": options.runtime_env, "grad_compression": _compression_text(comm),
        "bucket_mb": comm.bucket_mb, "precision": comm.precision.value if comm.precision else None,
        "retry_exceptions": list(options.retry_exceptions) if isinstance(options.retry_exceptions, tuple)
        else options.retry_exceptions,
        "sweep_id": lease.sweep_id,
    }


def options_from_json(data: Any) -> RunOptions:
    """The service's own validation of options a kernel sent: the same checks as gs.distributed,
    BadRunMessage (naming the field) for anything else."""
    if not isinstance(data, dict):
        raise BadRunMessage("the run's options must be an object")
    fields = dict(data)
    retry = fields.pop("retry_exceptions", False)
    sweep_id = fields.pop("sweep_id", None)
    try:
        options = validate_run_options(**fields)
    except TypeError as exc:
        raise BadRunMessage(f"the run's options: {exc}") from None
    except ValueError as exc:
        raise BadRunMessage(f"the run's options: {exc}") from None
    if not isinstance(retry, bool):
        if not isinstance(retry, list) or not retry or not all(
                isinstance(name, str) and QUALIFIED_NAME.match(name) for name in retry):
            raise BadRunMessage("retry_exceptions must be true, false or a list of qualified class names")
        retry = tuple(retry)
    if sweep_id is not None and not (isinstance(sweep_id, str) and SWEEP_ID.match(sweep_id)):
        raise BadRunMessage("sweep_id must be a short name of letters, digits and _.:-")
    return dataclasses.replace(options, retry_exceptions=retry,
                               lease=dataclasses.replace(options.lease, sweep_id=sweep_id))


def _compression_text(comm: CommOptions) -> str | None:
    if comm.grad_compression is Compression.POWERSGD:
        settings = comm.powersgd_settings
        return f"powersgd:rank={settings.rank},warmup={settings.warmup_steps}"
    return comm.grad_compression.value if comm.grad_compression else None


def _require_json(value: Any, name: str) -> None:
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, Real):
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"{name} holds {value!r}, which cannot travel to the gateway; use a finite number.")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _require_json(item, name)
        return
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        for item in value.values():
            _require_json(item, name)
        return
    raise TypeError(f"{name} holds a {type(value).__name__}; through the gpusession gateway it must be plain "
                    "JSON (strings, numbers, lists, dicts with string keys).")


# ----- RunInfo ------------------------------------------------------------------------------------
_PLAIN_FIELDS = ("lease_id", "gpus", "workers", "backend", "logical_gpus", "nodes", "queued_s", "setup_s",
                 "run_s", "gpu_seconds", "restarts", "resizes", "over_quota", "steps_lost", "transitions",
                 "state", "end_reason", "released", "shipped_bytes", "shipped_s", "returned_bytes", "returned_s",
                 "checkpoint_step")


def info_to_json(info: RunInfo, *, checkpoint: str | None) -> dict:
    """The RunInfo as it travels: plain fields, the history's length (reports travel one by one,
    with their events), rank hosts, communication, and the checkpoint's handle (see hosted.py)."""
    data = {name: getattr(info, name) for name in _PLAIN_FIELDS}
    data["rank_hosts"] = {str(rank): host for rank, host in info.rank_hosts.items()}
    data["history_len"] = len(info.history)
    data["communication"] = _comm_report_to_json(info.communication)
    data["checkpoint"] = checkpoint
    return data


def apply_info(info: RunInfo, data: dict) -> str | None:
    """Update the kernel's RunInfo from what the service sent; returns the checkpoint handle."""
    for name in _PLAIN_FIELDS:
        if name in data:
            setattr(info, name, data[name])
    info.rank_hosts = {int(rank): host for rank, host in (data.get("rank_hosts") or {}).items()}
    if "communication" in data:
        info.communication = _comm_report_from_json(data["communication"])
    kept = data.get("history_len")
    if isinstance(kept, int) and len(info.history) > kept:  # a restart dropped steps it redoes
        del info.history[kept:]
    return data.get("checkpoint")


def add_report(info: RunInfo, metrics: dict, data: dict) -> None:
    """A report event: the history as the service has it (its length includes this report)."""
    kept = data.get("history_len")
    if isinstance(kept, int):
        del info.history[max(0, kept - 1):]
    info.history.append(metrics)


def _comm_report_to_json(report: CommReport | None) -> dict | None:
    if report is None:
        return None
    comm = report.options
    return {"grad_compression": _compression_text(comm), "bucket_mb": comm.bucket_mb,
            "precision": comm.precision.value if comm.precision else None, "applied": report.applied,
            "steps": report.steps, "bytes_last_step": report.bytes_last_step,
            "fp32_bytes_per_step": report.fp32_bytes_per_step, "scaled_steps": report.scaled_steps}


def _comm_report_from_json(data: dict | None) -> CommReport | None:
    if not isinstance(data, dict):
        return None
    options = validate_comm_options(grad_compression=data.get("grad_compression"),
                                    bucket_mb=data.get("bucket_mb"), precision=data.get("precision"))
    return CommReport(options, bool(data.get("applied")), int(data.get("steps", 0)),
                      int(data.get("bytes_last_step", 0)), int(data.get("fp32_bytes_per_step", 0)),
                      int(data.get("scaled_steps", 0)))


# ----- errors -------------------------------------------------------------------------------------
# Plain Python errors the run path itself raises (bad arguments, a call too big for the store):
# rebuilt as themselves; anything else not gpusession's becomes a GPUSessionError naming its type.
_BUILTIN_ERRORS = {cls.__name__: cls for cls in (ValueError, TypeError, RuntimeError, MemoryError, TimeoutError)}
_ALL_ERRORS = {"GPUSessionError": errors.GPUSessionError, **errors.ERRORS_BY_NAME}


def error_to_json(error: BaseException) -> dict:
    """An error as text: its class name, message and (WorkerFailed) the rank's own account."""
    data = {"type": type(error).__name__,
            "message": str(error.args[0]) if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)}
    if isinstance(error, errors.WorkerFailed):
        data.update(rank=error.rank, node=error.node, remote_type=error.remote_type,
                    remote_message=error.remote_message, remote_traceback=error.remote_traceback)
    return data


def error_from_json(data: Any) -> BaseException:
    """The error the local path would have raised, rebuilt by name (never unpickled)."""
    if not isinstance(data, dict):
        return errors.GPUSessionError("The gpusession gateway ended the run without saying why.")
    name, message = str(data.get("type", "")), str(data.get("message", ""))
    if name == "KeyboardInterrupt":
        return KeyboardInterrupt(message) if message else KeyboardInterrupt()
    cls = _ALL_ERRORS.get(name) or _BUILTIN_ERRORS.get(name)
    if cls is not None and issubclass(cls, errors.WorkerFailed):
        return cls(message, rank=data.get("rank"), node=data.get("node"), remote_type=data.get("remote_type"),
                   remote_message=data.get("remote_message"), remote_traceback=data.get("remote_traceback"))
    if cls is not None:
        return cls(message)
    return errors.GPUSessionError(f"{name}: {message}" if name else message)


# ----- the kernel's stop --------------------------------------------------------------------------
def stop_reason(error: BaseException) -> StopReason:
    """What the kernel's stop says, from what its observer raised."""
    if isinstance(error, errors.RunCancelled):
        return StopReason.CANCELLED
    return StopReason.INTERRUPTED


def stop_error(reason: Any, message: Any) -> BaseException:
    """What the service's poll raises for a kernel's stop: the run ends as it would locally."""
    text = str(message)[:1000] if message else "the caller stopped the run"
    if reason == StopReason.CANCELLED:  # any other reason (or none) interrupts it
        return errors.RunCancelled(text)
    return KeyboardInterrupt(text)


def plain(value: Any) -> Any:
    """A value made JSON-safe for an event's fields (a queue view, a report's metrics): anything
    JSON cannot hold becomes its text."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value  # NaN and infinities travel as JSON's NaN/Infinity (Python's json reads them)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Real):
        return float(value)
    return str(value)
