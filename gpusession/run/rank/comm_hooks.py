"""Inside a rank: apply a run's CommOptions to the DDP model gs.prepare_model builds, and count
what its gradients put into all-reduce.

One DDP communication hook does both: it hands each bucket to torch's own hook (fp16/bf16
compress, PowerSGD or plain all-reduce) and adds up the bytes of what that hook all-reduces, so
the receipt's figure is measured from the buckets sent, step by step, not derived from the model.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from ..comm_options import CommOptions, CommReport, Compression, Precision
from ...errors import GPUSessionError

_FP32_BYTES = 4


@dataclass
class StepBytes:
    """Bytes all-reduced by this rank: the step in progress, and the last whole step."""

    steps: int = 0
    current: int = 0
    last: int = 0
    current_fp32: int = 0
    last_fp32: int = 0

    def add(self, sent: int, fp32: int, *, step_ends: bool) -> None:
        self.current += sent
        self.current_fp32 += fp32
        if step_ends:  # DDP calls the hook for the last bucket last in each backward pass
            self.steps += 1
            self.last, self.last_fp32 = self.current, self.current_fp32
            self.current = self.current_fp32 = 0


@dataclass
class RankComm:
    """What this rank applied: the options, the byte counts, the loss scaler (precision fp16)."""

    options: CommOptions
    applied: bool = False
    counted: StepBytes = field(default_factory=StepBytes)
    scaler: Any = None  # torch.amp.GradScaler when precision="fp16"
    scaled_steps: int = 0

    def report(self) -> CommReport:
        return CommReport(options=self.options, applied=self.applied, steps=self.counted.steps,
                          bytes_last_step=self.counted.last, fp32_bytes_per_step=self.counted.last_fp32,
                          scaled_steps=self.scaled_steps)


@dataclass
class _HookState:
    compression: Compression | None
    counted: StepBytes
    powersgd: Any = None  # powerSGD_hook.PowerSGDState
    wait_each_bucket: bool = False  # PowerSGD on gloo: see gpusession_comm_hook


def apply_to_ddp_options(options: CommOptions, ddp_options: dict) -> None:
    """bucket_mb becomes DDP's bucket_cap_mb; the same setting given twice is refused."""
    if options.bucket_mb is None:
        return
    if "bucket_cap_mb" in ddp_options:
        raise GPUSessionError(
            f"prepare_model got bucket_cap_mb={ddp_options['bucket_cap_mb']!r} while the run's bucket_mb is "
            f"{options.bucket_mb:g}: give one of them (bucket_mb on @gs.distributed / %%gpu --bucket-mb).")
    ddp_options["bucket_cap_mb"] = options.bucket_mb


def apply_to_model(ddp, comm: RankComm, device: torch.device) -> None:
    """Register the counting hook (compression included) and wrap forward in autocast."""
    options = comm.options
    check_backend(options, device)
    state = _HookState(options.grad_compression, comm.counted)
    if options.grad_compression is Compression.POWERSGD:
        settings = options.powersgd_settings
        state.powersgd = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=settings.rank,
            start_powerSGD_iter=settings.warmup_steps)
        state.wait_each_bucket = dist.get_backend() != "nccl"
    ddp.register_comm_hook(state, gpusession_comm_hook)
    if options.precision is not None:
        dtype = torch.bfloat16 if options.precision is Precision.BF16 else torch.float16
        forward = ddp.forward
        # Only the forward pass runs under autocast, as torch's AMP recipe says: backward follows
        # the dtypes the forward chose. The wrapped module is untouched (state_dict, unwrap).
        ddp.forward = functools.wraps(forward)(torch.autocast(device.type, dtype=dtype)(forward))
        if options.precision is Precision.FP16:
            comm.scaler = torch.amp.GradScaler(device.type)
    comm.applied = True


def check_backend(options: CommOptions, device: torch.device) -> None:
    """What only the rank can know: the GPU's and nccl's abilities (gloo on the CPU does all)."""
    if device.type != "cuda":
        return
    if options.precision is Precision.BF16 and not torch.cuda.is_bf16_supported():
        raise GPUSessionError(f"precision='bf16' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)} "
                              "has none. Use precision='fp16' or None.")
    if options.grad_compression is Compression.BF16 and dist.get_backend() == "nccl" \
            and torch.cuda.nccl.version() < (2, 10):
        raise GPUSessionError(f"grad_compression='bf16' needs nccl 2.10 or later; this torch has nccl "
                              f"{'.'.join(map(str, torch.cuda.nccl.version()))}. Use grad_compression='fp16'.")


# No annotations on purpose: DDP compares the hook's annotations with dist.GradBucket and
# Future[Tensor], and this module's postponed (string) annotations would fail that check.
def gpusession_comm_hook(state, bucket):
    """DDP communication hook: torch's hook for the chosen compression, plus byte counting."""
    buffer = bucket.buffer()
    fp32 = buffer.numel() * _FP32_BYTES
    if state.compression is Compression.POWERSGD:
        warming_up = state.powersgd.iter < state.powersgd.start_powerSGD_iter
        future = powerSGD_hook.powerSGD_hook(state.powersgd, bucket)
        if state.wait_each_bucket:
            # torch's PowerSGD waits for its next all-reduce inside a future's callback. On gloo
            # that callback runs on one of gloo's two threads: with two buckets in flight both
            # threads wait and the backward pass hangs for ever (seen with 12.6 MB of gradients
            # over a 200 Mbit/s link). Finishing each bucket here keeps one callback at a time.
            future.wait()
        sent = buffer.numel() * buffer.element_size() if warming_up else _powersgd_bytes(state.powersgd, bucket)
    elif state.compression in (Compression.FP16, Compression.BF16):
        future = (default_hooks.fp16_compress_hook if state.compression is Compression.FP16
                  else default_hooks.bf16_compress_hook)(None, bucket)
        sent = buffer.numel() * 2
    else:
        future = default_hooks.allreduce_hook(None, bucket)
        sent = buffer.numel() * buffer.element_size()
    state.counted.add(sent, fp32, step_ends=bucket.is_last())
    return future


def _powersgd_bytes(state, bucket) -> int:
    """The P and Q matrices PowerSGD allocated for this bucket, plus the tensors it leaves
    uncompressed (vectors, and matrices too small to gain), all sent as they are."""
    index = bucket.index()
    element = bucket.buffer().element_size()
    low_rank = state.p_memory_dict[index].numel() + state.q_memory_dict[index].numel()
    compressed = 0
    for tensor in bucket.gradients():
        n, m = tensor.view(tensor.shape[0], -1).shape
        rank = min(n, m, state.matrix_approximation_rank)
        if powerSGD_hook._should_compress(n, m, rank, state.min_compression_rate)[0]:
            compressed += tensor.numel()
    return (low_rank + bucket.buffer().numel() - compressed) * element


def step(loss, optimizer, comm: RankComm | None) -> None:
    """Backward, optimizer step, zero the gradients; with precision='fp16' the loss is scaled
    (and a step whose gradients overflowed is skipped, as GradScaler does)."""
    scaler = comm.scaler if comm is not None else None
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        comm.scaled_steps += 1
    optimizer.zero_grad(set_to_none=True)
