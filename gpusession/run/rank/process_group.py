"""A rank's default process group: gpusession joins it before the function runs, and a torchrun
script's own `init_process_group` call lands on it instead of failing.

Under torchrun a script initialises the group itself; in a rank the group is already there
(gs.prepare_model and code that never calls init_process_group need it), and torch refuses a
second default group. So the rank process, and only it (never the warm parent or the worker
actor), replaces `init_process_group` in torch.distributed with `RankGroup.init_process_group`,
which gives the script what torchrun would have given it:
- a backend gpusession's group serves (the same name, None, or device:backend pairs it covers):
  that group, with no second rendezvous; a `timeout` given applies to it from then on;
- another backend, or a call after the script's own destroy_process_group(): a new default group
  of that backend, of the same rank and world size, over the attempt's store (rank 0's actor
  serves MASTER_PORT, as torchrun's agent does, so no rank may bind it);
- a rendezvous of its own (`store=`, or an init_method other than env://): exactly that, after
  gpusession's group is released;
- a second call while its first group is up: torch's "initialize ... twice" error, as under torchrun.
"""
from __future__ import annotations

import enum
import itertools
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


class Step(enum.Enum):
    KEEP = "keep gpusession's group"
    NEW_GROUP = "a new group over the attempt's store"
    OWN_RENDEZVOUS = "torch's init_process_group with the script's own arguments"


def backend_map(backend: str | None, device_id=None) -> dict[str, str]:
    """Which backend serves which device type for an init_process_group(backend, device_id=...)
    call, by torch's own rules (None: the device_id's default backend, else the machine's)."""
    if backend is None and device_id is not None:
        device_type = device_id.type if isinstance(device_id, torch.device) else torch.device(device_id).type
        backend = c10d.Backend.default_device_backend_map.get(device_type)
    config = c10d.BackendConfig(c10d.Backend(backend or c10d.Backend.UNDEFINED))
    return {device: str(name) for device, name in config.device_backend_map.items()}


def decide(*, ours: dict[str, str], wanted: dict[str, str], own_rendezvous: bool, ours_up: bool) -> Step:
    """What a script's init_process_group call gets, given the backends gpusession's group serves
    (`ours`), those asked for, whether the script brings its own rendezvous, and whether
    gpusession's group is still the default one (not destroyed, not claimed by an earlier call)."""
    if own_rendezvous:
        return Step.OWN_RENDEZVOUS
    if ours_up and all(ours.get(device) == name for device, name in wanted.items()):
        return Step.KEEP
    return Step.NEW_GROUP


class RankGroup:
    """The process group of one rank. `store` is for tests that bring their own."""

    def __init__(self, spec, store=None) -> None:
        self.spec = spec
        self._store = store
        self._ours = None  # gpusession's group while no init_process_group call has claimed it
        self._generations = itertools.count(1)  # each new group's keys apart from the last's
        self._torch_init = c10d.init_process_group

    def install(self) -> None:
        """Route the script's init_process_group calls here; before the function is unpickled, so
        a module that does `from torch.distributed import init_process_group` binds this too."""
        dist.init_process_group = c10d.init_process_group = self.init_process_group

    def join(self) -> None:
        """Join the attempt's group through the store rank 0's actor serves."""
        self._join(self.spec.backend, "", timedelta(seconds=self.spec.pg_timeout_s))
        self._ours = dist.group.WORLD

    def init_process_group(self, backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                           store=None, group_name="", pg_options=None, device_id=None, **rest) -> None:
        """torch.distributed.init_process_group as a script under torchrun sees it (module doc)."""
        ours, self._ours = self._ours, None  # claimed: a second call meets torch's own refusal
        ours_up = ours is not None and dist.group.WORLD is ours
        own_rendezvous = store is not None or init_method not in (None, "env://")
        step = decide(ours=backend_map(self.spec.backend), wanted=backend_map(backend, device_id),
                      own_rendezvous=own_rendezvous, ours_up=ours_up)
        if step is not Step.OWN_RENDEZVOUS:
            self._check_place(rank, world_size)
        if step is Step.KEEP:
            if timeout is not None:
                c10d._set_pg_timeout(timeout, ours)
            return
        if ours_up:
            dist.destroy_process_group()
        if step is Step.OWN_RENDEZVOUS or dist.is_initialized():  # the latter: torch refuses a second group
            self._torch_init(backend, init_method, timeout, world_size, rank, store, group_name, pg_options,
                             device_id, **rest)
            return
        self._join(backend, f"script-{next(self._generations)}/",
                   timeout or timedelta(seconds=self.spec.pg_timeout_s), pg_options=pg_options,
                   device_id=device_id, wanted=backend_map(backend, device_id))

    def _check_place(self, rank: int, world_size: int) -> None:
        spec = self.spec
        if rank not in (-1, spec.rank) or world_size not in (-1, spec.world_size):
            raise ValueError(
                f"init_process_group(rank={rank}, world_size={world_size}) does not match this process: "
                f"rank {spec.rank} of {spec.world_size} (RANK, WORLD_SIZE). Leave rank and world_size "
                "out, or read them from the environment as under torchrun."
            )

    def _join(self, backend: str | None, prefix: str, timeout: timedelta, *, wanted=None, **options) -> None:
        spec = self.spec
        if "nccl" in (wanted or backend_map(backend)).values():
            self._use_own_gpu()
        if self._store is None:
            self._store = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size,
                                        is_master=False, timeout=timeout)
        # Keys under this attempt's own prefix: nothing of another run can ever be read by mistake.
        scoped = dist.PrefixStore(f"gpusession/{spec.lease_id}/{spec.run_id}/{prefix}", self._store)
        self._torch_init(backend, store=scoped, rank=spec.rank, world_size=spec.world_size, timeout=timeout,
                         **options)
        # Each rank connects its own side of gloo's mesh. Without this barrier a rank whose function
        # does no collective could finish, close its sockets, and fail a peer still connecting
        # ("Gloo connectFullMesh failed ... Connection closed by peer").
        scoped.set(f"connected/{spec.rank}", "1")
        scoped.wait([f"connected/{rank}" for rank in range(spec.world_size)], timeout)

    def _use_own_gpu(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"backend='nccl' needs CUDA, but torch on {socket.gethostname()} sees no GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use backend='gloo'."
            )
        torch.cuda.set_device(local_devices(self.spec)[0])


def local_devices(spec) -> list[int]:
    """This rank's GPUs as indices under the node's CUDA_VISIBLE_DEVICES."""
    return [spec.node_gpu_ids.index(gpu) for gpu in spec.gpu_ids]
