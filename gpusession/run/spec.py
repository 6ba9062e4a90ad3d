"""What one rank of one attempt is (RankSpec) and where its scratch files go.

Kept free of Ray on purpose: a rank process unpickles its RankSpec, and importing Ray there
would cost every fresh rank a second or more.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from .comm_options import CommOptions
from .privatedir import private_dir


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    backend: str
    node_gpu_ids: tuple[str, ...]  # every GPU of the lease on this node, in order
    gpu_ids: tuple[str, ...]  # this worker's own GPUs (a subset of node_gpu_ids)
    lease_id: int
    logical_gpus: bool
    return_value: bool  # rank 0, or every rank with return_all
    caller_host: str
    caller_cwd: str
    pg_timeout_s: float
    run_id: str = ""  # unique per attempt: the rendezvous keys live under it
    group_id: str | None = None  # the lease's placement group: if it is removed, this worker stops
    attempt: int = 0
    address: str = ""  # this rank's Ray node IP
    node_id: str = ""  # this rank's Ray node id
    cluster: str = ""  # the Ray session's name: unique per cluster (and per start of it)
    comm: CommOptions = field(default_factory=CommOptions)  # what gs.prepare_model applies
    caller_account: str = ""  # the caller's Unix account: under the hub, ranks run as another one


SCRATCH_ROOT = "gpusession-scratch"


def scratch_root() -> str:
    """This account's own scratch folder in its temporary directory (`gpusession-scratch-<uid>`,
    0700, checked: privatedir.py): in a shared /tmp, where several accounts run `gpusession lab`,
    a fixed name would be the first account's, and it would block or see the others'. (Behind
    `gpusession hub` the worker actor's TMPDIR is the service's own, and a rank's is the folder
    the launcher made for its user.)"""
    return private_dir(tempfile.gettempdir(), f"{SCRATCH_ROOT}-{os.geteuid()}",
                       holds="scratch directories")


def lease_scratch_dir(cluster: str, lease_id: int) -> str:
    return os.path.join(scratch_root(), cluster or "no-cluster", f"lease-{lease_id}")


def scratch_dir(spec: RankSpec) -> str:
    """The attempt's scratch directory on this node: keyed by cluster, lease and attempt, so two
    clusters on one filesystem, or two attempts of one run, never share one (run/node/scratch.py
    removes it)."""
    return os.path.join(lease_scratch_dir(spec.cluster, spec.lease_id), f"attempt-{spec.attempt}")
