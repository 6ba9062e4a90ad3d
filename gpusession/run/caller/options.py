"""Validation of the options of `gs.distributed` / `gs.lease`, before anything is leased."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Any

from ...broker.policy.model import Placement, Priority
from ..comm_options import CommOptions, validate_comm_options

BACKENDS = ("nccl", "gloo")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}
_TOLERANCE = 1e-9


def parse_duration(value: Any, *, field_name: str) -> float | None:
    """Seconds from 90, 90.5, "90s", "10m", "2h" or "1d"; None stays None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{field_name} must be seconds or a string like '90s', '10m', '2h'; got {value!r}.")
    if isinstance(value, Real):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValueError(
            f"{field_name} must be seconds or a string like '90s', '10m', '2h'; got {value!r}."
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{field_name} must be more than 0 seconds; got {value!r}. Use None for no limit.")
    return seconds


def _gpu_count(value: Any, *, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{field_name} must be a number of GPUs, e.g. {field_name}=2; got {value!r}.")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{field_name} must be more than 0; got {value!r}.")
    return number


def _is_whole(number: float) -> bool:
    return abs(number - round(number)) < _TOLERANCE


@dataclass(frozen=True)
class LeaseOptions:
    """What a lease asks the broker for."""

    gpus: float = 1
    gpus_per_worker: float = 1
    min_gpus: float | None = None
    priority: Priority = Priority.NORMAL
    placement: Placement = Placement.PACK
    queue_timeout_s: float | None = None
    max_hold_s: float | None = None  # tells the scheduler how long the lease may be held
    sweep_id: str | None = None  # internal: the gs.sweep this lease is a trial of (one sweep in views)

    @property
    def workers(self) -> int:
        return int(round(self.gpus / self.gpus_per_worker))

    @property
    def min_workers(self) -> int | None:
        if self.min_gpus is None or self.min_gpus >= self.gpus - _TOLERANCE:
            return None
        return int(round(self.min_gpus / self.gpus_per_worker))


@dataclass(frozen=True)
class RunOptions:
    """Everything `gs.distributed` accepts, validated."""

    lease: LeaseOptions = field(default_factory=LeaseOptions)
    timeout_s: float | None = None
    backend: str | None = None
    max_failures: int = 3
    return_all: bool = False
    runtime_env: dict | None = None
    retry_exceptions: bool | tuple[str, ...] = False  # qualified class names when a tuple
    comm: CommOptions = field(default_factory=CommOptions)  # what gs.prepare_model applies


def for_held_lease(options: RunOptions) -> RunOptions:
    """The options of a held lease (gs.lease): `timeout` bounds each run on it, not the lease, so
    the broker is told of no hold limit."""
    return replace(options, lease=replace(options.lease, max_hold_s=None))


def validate_lease_options(
    *,
    gpus: Any = 1,
    gpus_per_worker: Any = 1,
    min_gpus: Any = None,
    priority: Any = "normal",
    placement: Any = "pack",
    queue_timeout: Any = None,
    max_hold_s: float | None = None,
) -> LeaseOptions:
    total = _gpu_count(gpus, field_name="gpus")
    per_worker = _gpu_count(gpus_per_worker, field_name="gpus_per_worker")
    if per_worker > 1 and not _is_whole(per_worker):
        raise ValueError(
            f"gpus_per_worker must be a fraction of one GPU (e.g. 0.5) or a whole number; got {gpus_per_worker!r}."
        )
    if not _is_whole(total / per_worker):
        raise ValueError(
            f"gpus ({gpus!r}) must be a whole multiple of gpus_per_worker ({gpus_per_worker!r}): "
            f"the number of workers is gpus / gpus_per_worker. Try gpus={math.ceil(total / per_worker) * per_worker:g}."
        )
    minimum = None
    if min_gpus is not None:
        minimum = _gpu_count(min_gpus, field_name="min_gpus")
        if minimum > total + _TOLERANCE:
            raise ValueError(f"min_gpus ({min_gpus!r}) must not exceed gpus ({gpus!r}).")
        if not _is_whole(minimum / per_worker):
            raise ValueError(
                f"min_gpus ({min_gpus!r}) must be a whole multiple of gpus_per_worker ({gpus_per_worker!r})."
            )
    return LeaseOptions(
        gpus=total,
        gpus_per_worker=per_worker,
        min_gpus=minimum,
        priority=Priority.parse(priority),
        placement=Placement.parse(placement),
        queue_timeout_s=parse_duration(queue_timeout, field_name="queue_timeout"),
        max_hold_s=max_hold_s,
    )


def validate_run_options(
    *,
    gpus: Any = 1,
    gpus_per_worker: Any = 1,
    min_gpus: Any = None,
    priority: Any = "normal",
    timeout: Any = None,
    queue_timeout: Any = None,
    backend: Any = None,
    placement: Any = "pack",
    max_failures: Any = 3,
    return_all: Any = False,
    runtime_env: Any = None,
    retry_exceptions: Any = False,
    grad_compression: Any = None,
    bucket_mb: Any = None,
    precision: Any = None,
) -> RunOptions:
    timeout_s = parse_duration(timeout, field_name="timeout")
    lease = validate_lease_options(
        gpus=gpus,
        gpus_per_worker=gpus_per_worker,
        min_gpus=min_gpus,
        priority=priority,
        placement=placement,
        queue_timeout=queue_timeout,
        max_hold_s=timeout_s,
    )
    if backend is not None:
        if not isinstance(backend, str) or backend.lower() not in BACKENDS:
            raise ValueError(f"backend must be None, 'nccl' or 'gloo'; got {backend!r}.")
        backend = backend.lower()
    if backend == "nccl" and lease.gpus_per_worker < 1:
        raise ValueError(
            f"backend='nccl' needs whole GPUs per worker, but gpus_per_worker={lease.gpus_per_worker:g}: "
            "nccl cannot put two ranks on one GPU. Use backend='gloo' or gpus_per_worker=1."
        )
    if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 0:
        raise ValueError(f"max_failures must be a whole number >= 0; got {max_failures!r}.")
    if not isinstance(return_all, bool):
        raise TypeError(f"return_all must be True or False; got {return_all!r}.")
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise TypeError(
            f"runtime_env must be a dict for Ray (e.g. {{'pip': ['einops']}}); got {type(runtime_env).__name__}."
        )
    return RunOptions(
        lease=lease,
        timeout_s=timeout_s,
        backend=backend,
        max_failures=max_failures,
        return_all=return_all,
        runtime_env=dict(runtime_env) if runtime_env else None,
        retry_exceptions=_retry_exceptions(retry_exceptions),
        comm=validate_comm_options(grad_compression=grad_compression, bucket_mb=bucket_mb, precision=precision),
    )


def _retry_exceptions(value: Any) -> bool | tuple[str, ...]:
    """False, True, an exception class or a tuple of them -> False, True or qualified names
    (the exception happens in another process: it is matched by its classes' names)."""
    if isinstance(value, bool):
        return value
    classes = value if isinstance(value, tuple) else (value,)
    if not classes or not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
        raise TypeError(
            "retry_exceptions must be True, False, an exception class or a tuple of them "
            f"(e.g. retry_exceptions=(TimeoutError,)); got {value!r}."
        )
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in classes)
