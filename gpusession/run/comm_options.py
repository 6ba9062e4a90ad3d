"""PURE: the communication options of a run (gradient compression, DDP bucket size, mixed
precision), validated before anything is leased, and what a run reports back about them.

Kept free of torch and Ray: a rank process unpickles these inside its RankSpec.

What each option does, and where it was verified:
- grad_compression="fp16" / "bf16": each DDP bucket is cast to 16 bits, all-reduced, cast back
  (torch's fp16/bf16 compress hooks): half the bytes on the link, gradients rounded to 16 bits.
- grad_compression="powersgd": torch's PowerSGD hook, rank POWERSGD_RANK, plain all-reduce for
  the first POWERSGD_WARMUP_STEPS steps, with error feedback and warm start (its defaults):
  each weight matrix n x m sends (n + m) x rank numbers instead of n x m.
  grad_compression=gs.PowerSGD(rank=4, warmup_steps=20) chooses both (%%gpu:
  --grad-compression powersgd:rank=4,warmup=20); a higher rank sends more and loses less.
- bucket_mb: DDP's bucket_cap_mb (torch's default 25): gradients are all-reduced in buckets of
  about this size, overlapping with the backward pass.
- precision="bf16" / "fp16": the model's forward runs under torch.autocast on the rank's device
  (weights and optimizer state stay fp32); "fp16" also scales the loss (torch.amp.GradScaler)
  in `gs.step(loss, optimizer)`, so small gradients do not underflow.
All of them work with gloo on the CPU (torch 2.13: fp16 and bf16 all-reduce, fp16 and bf16
autocast and the CPU GradScaler); on nccl every option ran at 1 rank on one H200
(benchmarks/gpu_check.py), never between several ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from numbers import Real
from typing import Any

POWERSGD_RANK = 2  # matrix approximation rank: torch's docs suggest starting low (1-4)
POWERSGD_WARMUP_STEPS = 10  # plain all-reduce first: PowerSGD's error feedback needs a settled start
DDP_DEFAULT_BUCKET_MB = 25.0  # torch's bucket_cap_mb default
MAX_BUCKET_MB = 4096.0
MIN_POWERSGD_WARMUP_STEPS = 2  # torch's PowerSGDState refuses fewer (error feedback needs two plain steps)
MAX_POWERSGD_RANK = 1024  # beyond this the low-rank matrices outweigh most layers' gradients


class Compression(Enum):
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"


class Precision(Enum):
    BF16 = "bf16"
    FP16 = "fp16"


def _choice(enum: type[Enum], value: Any, *, field_name: str, advice: str) -> Enum | None:
    if value is None or isinstance(value, enum):
        return value
    choices = ", ".join(repr(member.value) for member in enum)
    if isinstance(value, str):
        for member in enum:
            if member.value == value.strip().lower():
                return member
    raise ValueError(f"{field_name} must be None, {choices}; got {value!r}. {advice}")


def _whole_number(value: Any, *, field_name: str, low: int, high: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"PowerSGD {field_name} must be a whole number, e.g. {example}; got {value!r}.")
    if not low <= value <= high:
        raise ValueError(f"PowerSGD {field_name} must be from {low} to {high}; got {value!r}. e.g. {example}.")
    return value


@dataclass(frozen=True)
class PowerSGD:
    """grad_compression=gs.PowerSGD(rank=4, warmup_steps=20): torch's PowerSGD hook with this
    matrix approximation rank (higher: more bytes, less error), after `warmup_steps` steps of
    plain all-reduce. The string "powersgd" is PowerSGD() (rank 2, 10 warm-up steps)."""

    rank: int = POWERSGD_RANK
    warmup_steps: int = POWERSGD_WARMUP_STEPS

    def __post_init__(self) -> None:
        _whole_number(self.rank, field_name="rank", low=1, high=MAX_POWERSGD_RANK, example="rank=4")
        # torch's PowerSGD with error feedback and warm start can begin at the third step at the earliest
        _whole_number(self.warmup_steps, field_name="warmup_steps", low=MIN_POWERSGD_WARMUP_STEPS, high=10**9,
                      example="warmup_steps=20")

    def describe(self) -> str:
        return f"powersgd (rank {self.rank}, after {self.warmup_steps} steps)"


_POWERSGD_KEYS = {"rank": "rank", "warmup": "warmup_steps", "warmup_steps": "warmup_steps"}


def parse_powersgd(text: str) -> PowerSGD:
    """'powersgd:rank=4,warmup=20' (the %%gpu flag's form; either key may be left out) -> PowerSGD."""
    name, _, settings = text.strip().partition(":")
    if name.strip().lower() != "powersgd":
        raise ValueError(f"{text!r} is not 'powersgd:rank=R,warmup=S'.")
    chosen = {}
    for part in filter(None, (s.strip() for s in settings.split(","))):
        key, equals, number = part.partition("=")
        field_name = _POWERSGD_KEYS.get(key.strip().lower())
        if not equals or field_name is None or not number.strip().isdigit():
            raise ValueError(f"grad_compression {text!r}: {part!r} is not rank=R or warmup=S (whole numbers), "
                             "e.g. 'powersgd:rank=4,warmup=20'.")
        chosen[field_name] = int(number)
    return PowerSGD(**chosen)


def grad_compression_flag_value(text: str) -> str | PowerSGD:
    """%%gpu --grad-compression's text: 'fp16', 'bf16', 'powersgd' or 'powersgd:rank=4,warmup=20'."""
    lowered = text.strip().lower()
    if lowered in {member.value for member in Compression}:
        return lowered
    if lowered.startswith("powersgd:"):
        return parse_powersgd(text)
    raise ValueError(f"invalid choice: {text!r} (choose fp16, bf16, powersgd, or powersgd:rank=R,warmup=S "
                     "such as powersgd:rank=4,warmup=20)")


def _grad_compression(value: Any) -> tuple[Compression | None, PowerSGD | None]:
    """A string, a Compression or a PowerSGD -> (the kind, PowerSGD's settings when that is the kind)."""
    if isinstance(value, PowerSGD):
        return Compression.POWERSGD, value
    if isinstance(value, str) and ":" in value:
        return Compression.POWERSGD, parse_powersgd(value)
    kind = _choice(Compression, value, field_name="grad_compression",
                   advice="None sends fp32 gradients as DDP does by default; gs.PowerSGD(rank=..., "
                          "warmup_steps=...) chooses PowerSGD's settings.")
    return kind, (PowerSGD() if kind is Compression.POWERSGD else None)


def _bucket_mb(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"bucket_mb must be a number of megabytes, e.g. bucket_mb=50; got {value!r}.")
    size = float(value)
    if not math.isfinite(size) or not 0 < size <= MAX_BUCKET_MB:
        raise ValueError(f"bucket_mb must be more than 0 and at most {MAX_BUCKET_MB:g} (MB); got {value!r}. "
                         f"Use None for DDP's default ({DDP_DEFAULT_BUCKET_MB:g} MB).")
    return size


@dataclass(frozen=True)
class CommOptions:
    """What `gs.prepare_model` applies to the DDP model it builds; all None: DDP's defaults."""

    grad_compression: Compression | None = None
    bucket_mb: float | None = None
    precision: Precision | None = None
    powersgd: PowerSGD | None = None  # PowerSGD's settings, set when grad_compression is POWERSGD

    @property
    def powersgd_settings(self) -> PowerSGD:
        return self.powersgd or PowerSGD()

    @property
    def is_default(self) -> bool:
        return self.grad_compression is None and self.bucket_mb is None and self.precision is None

    def describe(self) -> str:
        """'grads powersgd (rank 2, after 10 steps) · bucket 50 MB · bf16 autocast'; '' if default."""
        parts = []
        if self.grad_compression is Compression.POWERSGD:
            parts.append(f"grads {self.powersgd_settings.describe()}")
        elif self.grad_compression is not None:
            parts.append(f"grads {self.grad_compression.value}")
        if self.bucket_mb is not None:
            parts.append(f"bucket {self.bucket_mb:g} MB")
        if self.precision is not None:
            parts.append(f"{self.precision.value} autocast")
        return " · ".join(parts)


def validate_comm_options(*, grad_compression: Any = None, bucket_mb: Any = None,
                          precision: Any = None) -> CommOptions:
    kind, powersgd = _grad_compression(grad_compression)
    return CommOptions(
        grad_compression=kind,
        bucket_mb=_bucket_mb(bucket_mb),
        precision=_choice(Precision, precision, field_name="precision",
                          advice="None keeps the model in fp32."),
        powersgd=powersgd,
    )


@dataclass(frozen=True)
class CommReport:
    """Rank 0's account of what it applied, sent to the caller when its function returns.

    Bytes are what rank 0's hook handed to all-reduce in the last step counted (its own
    contribution; a ring all-reduce puts about 2 x (world - 1) / world of it on each rank's link)."""

    options: CommOptions
    applied: bool  # False: the function never called gs.prepare_model, so nothing was applied
    steps: int = 0  # backward passes whose gradients went through the hook
    bytes_last_step: int = 0
    fp32_bytes_per_step: int = 0  # the same gradients uncompressed
    scaled_steps: int = 0  # gs.step calls that scaled the loss (precision="fp16")

    def summary(self) -> str:
        """One part of the receipt line."""
        if not self.applied:
            return f"{self.options.describe()} NOT applied (the function never called gs.prepare_model)"
        text = self.options.describe()
        if self.steps:
            text += (f" · {_megabytes(self.bytes_last_step)} all-reduced per step per rank"
                     f" (fp32: {_megabytes(self.fp32_bytes_per_step)})")
        if self.options.precision is Precision.FP16:
            text += f" · loss scaled in {self.scaled_steps} gs.step calls"
        return text


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3g} MB"
