"""What this machine and a test's cluster have, so that expected values follow them: on a machine
without CUDA a cluster's GPUs are logical (ranks train on the CPU with gloo); with CUDA, real (nccl,
cuda devices, receipts without "logical"). Tests compare with the cluster's own report
(`cluster.logical`, from the broker's cluster view) or, for a cluster a test starts with the
embedded default, with this machine (`own_cluster_logical()`)."""
from __future__ import annotations

import functools


@functools.cache
def cuda_gpus() -> int:
    """CUDA GPUs torch sees in this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def own_cluster_logical() -> bool:
    """Whether the embedded default cluster (a head a test starts itself) declares logical GPUs."""
    return cuda_gpus() == 0


def gpus_text(count: int, *, logical: bool) -> str:
    """How receipts and status lines name `count` GPUs: "2 logical GPUs", "1 GPU"."""
    return f"{count}{' logical' if logical else ''} GPU{'' if count == 1 else 's'}"


def backend(*, logical: bool) -> str:
    """The process group backend a run with whole GPUs per worker picks."""
    return "gloo" if logical else "nccl"


def device_type(*, logical: bool) -> str:
    """Where a rank's tensors live."""
    return "cpu" if logical else "cuda"


def cluster_line(count: int, *, logical: bool) -> str:
    """How `gs.status()`, `%gpu status` and `gpusession status` begin their cluster line."""
    return f"{count} GPUs (logical" if logical else f"{count} GPUs"
