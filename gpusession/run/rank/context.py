"""What user code calls inside a worker: context, report, checkpoints, prepare_model/loader."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from numbers import Number
from typing import Any

from ...errors import GPUSessionError

_STOP_AT_COMMIT_WAIT_S = 10.0  # bound only: the caller stops the attempt within a second or so
_NOT_IN_RUN = (
    "{name}() only works inside a function run by @gs.distributed, gs.lease().run or a %%gpu cell."
)


@dataclass(frozen=True)
class RunContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: Any  # torch.device: this worker's first GPU, or cpu
    devices: tuple  # every GPU of this worker (several when gpus_per_worker > 1)
    backend: str
    lease_id: int
    scratch_dir: str  # per cluster, lease, attempt and node; removed when the attempt ends
    gpu_ids: tuple[str, ...]  # the GPU ids Ray gave this worker
    logical_gpus: bool  # the cluster's GPUs are logical: training runs on the CPU
    restarts: int = 0  # attempts before this one (same as `attempt`)
    attempt: int = 0  # 0 first; each restart after a fault starts the next attempt
    host: str = ""  # this rank's host name
    address: str = ""  # this rank's Ray node IP
    node_id: str = ""  # this rank's Ray node id (the rank is a plain process, not a Ray worker)


@dataclass
class _Run:
    context: RunContext
    channel: Any  # run.child.Channel: the pipe to this rank's worker actor
    checkpoint_bytes: bytes | None = None  # pickled checkpoint to resume from
    loader_epochs: tuple = ()  # that checkpoint's: per loader prepared at the start, the epoch to resume
    checkpoint_value: Any = None
    checkpoint_loaded: bool = False
    checkpoints_saved: int = 0
    loaders_prepared: int = 0
    loaders: list = field(default_factory=list)  # rank 0: weak refs to the loaders prepared before its first commit
    watching: bool = False  # rank 0 called should_checkpoint() (the caller was told)
    comm_options: Any = None  # comm_options.CommOptions of the run: what prepare_model applies
    comm: Any = None  # comm_hooks.RankComm once prepare_model applied them


_current: _Run | None = None


def _run(name: str) -> _Run:
    if _current is None:
        raise GPUSessionError(_NOT_IN_RUN.format(name=name))
    return _current


def context() -> RunContext:
    """This worker's rank, world size, device(s), lease id, scratch directory, and where it runs:
    .host, .address (the Ray node IP) and .node_id (the Ray node id). Use these, not Ray's
    API: a rank is a plain process, not a Ray worker (ray.* inside it raises RayInRank)."""
    return _run("gs.context").context


def report(metrics: dict | None = None, /, **values: Any) -> None:
    """Stream metrics to the caller (live table and plot); only rank 0's reports are kept."""
    run = _run("gs.report")
    if run.context.rank != 0:
        return
    merged = {**(metrics or {}), **values}
    from .. import messages

    run.channel.send(messages.Report({str(k): _plain(v) for k, v in merged.items()}))


def save_checkpoint(state: Any) -> None:
    """Commit point: rank 0's object is kept by the caller (other ranks' calls do nothing).
    Returns once the caller holds a copy on its own node, so a restart after this line resumes
    from it, whichever worker or node is lost. The epochs of the loaders prepared before it (see
    prepare_loader) are kept with it."""
    run = _run("gs.save_checkpoint")
    if run.context.rank != 0:
        return
    import cloudpickle

    from .. import messages

    data = cloudpickle.dumps(state)
    epochs = tuple(_resume_epoch(ref) for ref in run.loaders)
    run.checkpoints_saved += 1
    requested = run.channel.checkpoint_requested.is_set()
    run.channel.send(messages.CheckpointSaved(run.checkpoints_saved), messages.CheckpointData(data, epochs))
    run.channel.wait_ack()  # the caller holds its own copy, on its node: no worker's loss can take it
    if requested:
        # The commit the caller asked for: it now stops this attempt (to resize or to stop the
        # run). Going on would only compute a step that the next attempt computes again.
        run.channel.checkpoint_withdrawn.wait(_STOP_AT_COMMIT_WAIT_S)


def load_checkpoint() -> Any:
    """The latest checkpoint of this run (after a restart, a resize or `resume()`), or None."""
    run = _run("gs.load_checkpoint")
    if not run.checkpoint_loaded:
        if run.checkpoint_bytes is not None:
            import cloudpickle

            run.checkpoint_value = cloudpickle.loads(run.checkpoint_bytes)
        run.checkpoint_loaded = True
    return run.checkpoint_value


def should_checkpoint() -> bool:
    """True once the run is about to stop or change size (a preemption, a revoke, a shrink of an
    elastic run, or free GPUs to grow back on): save a checkpoint now; the run then stops or
    resizes at that commit, losing no step."""
    run = _run("gs.should_checkpoint")
    if run.context.rank == 0 and not run.watching:
        # A function that asks commits when told: a notice to stop then waits for that commit
        # (until just before its deadline) even if the function never committed before.
        from .. import messages

        run.watching = True
        run.channel.send(messages.WatchesCheckpoints())
    return run.channel.checkpoint_requested.is_set()


def prepare_model(model, **ddp_options: Any):
    """Move the model to this worker's device and wrap it in DistributedDataParallel, with the
    run's grad_compression, bucket_mb and precision applied (see gs.step for fp16)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    run = _run("gs.prepare_model")
    ctx = run.context
    model = model.to(ctx.device)
    if not dist.is_initialized():
        raise GPUSessionError("prepare_model() needs the process group, which gpusession initialises per run.")
    if ctx.device.type == "cuda" and len(ctx.devices) == 1:
        ddp_options.setdefault("device_ids", [ctx.device])
    options = run.comm_options
    if options is None or options.is_default:
        return DistributedDataParallel(model, **ddp_options)
    from . import comm_hooks

    comm_hooks.apply_to_ddp_options(options, ddp_options)
    ddp = DistributedDataParallel(model, **ddp_options)
    run.comm = run.comm or comm_hooks.RankComm(options)
    comm_hooks.apply_to_model(ddp, run.comm, ctx.device)
    return ddp


def step(loss, optimizer) -> None:
    """`loss.backward(); optimizer.step(); optimizer.zero_grad()`, with the loss scaled when the
    run has precision='fp16' (torch.amp.GradScaler: a step whose gradients overflowed is
    skipped and the scale lowered). Without fp16 it is exactly those three calls."""
    from . import comm_hooks

    comm_hooks.step(loss, optimizer, _run("gs.step").comm)


def communication_report(run: _Run):
    """Rank 0's CommReport for the caller, or None when the run asked for DDP's defaults."""
    if run.comm_options is None or run.comm_options.is_default:
        return None
    if run.comm is not None:
        return run.comm.report()
    from ..comm_options import CommReport

    return CommReport(options=run.comm_options, applied=False)


def unwrap(model):
    """The plain module inside a DDP (or DataParallel) wrapper; other objects unchanged."""
    while hasattr(model, "module") and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
        model = model.module
    return model


def prepare_loader(loader, *, move_to_device: bool = True):
    """Rebuild a DataLoader with a DistributedSampler for the current world size.

    Shuffling follows the original loader; the sampler's epoch advances on every pass, so
    each epoch is shuffled differently (as `sampler.set_epoch(epoch)` would do; an explicit
    `loader.sampler.set_epoch(n)` before a pass wins). After a restart, a resize or `resume()`,
    the loaders prepared before the function's first gs.save_checkpoint continue the epochs of
    the attempt that made the checkpoint (matched in the order they are prepared): the pass that
    was in progress at the commit if batches of it remained, else the next one. A pass resumed
    mid-epoch starts again from its first batch, in the same order: skipping what the
    checkpoint already covers is up to the function."""
    from .loaders import distributed_loader

    run = _run("gs.prepare_loader")
    ctx = run.context
    index, run.loaders_prepared = run.loaders_prepared, run.loaders_prepared + 1
    resumed = run.loader_epochs[index] if index < len(run.loader_epochs) else None
    prepared = distributed_loader(loader, rank=ctx.rank, world_size=ctx.world_size,
                                  device=ctx.device if move_to_device else None, epoch=resumed or 0)
    if ctx.rank == 0 and run.checkpoints_saved == 0:
        run.loaders.append(weakref.ref(prepared))
    return prepared


def _resume_epoch(ref) -> int | None:
    loader = ref()
    return loader.resume_epoch() if loader is not None else None


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars become Python numbers, so reports stay small and plottable."""
    if isinstance(value, (bool, str, Number)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 1)() == 1:
        return item()
    return value
