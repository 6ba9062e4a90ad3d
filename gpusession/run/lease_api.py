"""`gs.lease(...)`: GPUs held across several runs until released (a `with` block, or
`release()`), where `@gs.distributed` holds them for one call. The lease itself (broker
protocol, placement group) is cluster/lease.py; this is what a user calls."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..cluster.lease import Lease
from ..errors import GPUSessionError
from ..options import validate_run_options
from ..renderer import default_observer
from .idle_resize import resize_while_idle


def lease(**options: Any) -> Lease:
    """Lease GPUs now (waiting in the queue if needed) and hold them until released.

    In [1]: with gs.lease(gpus=2) as lease:
       ...:     lease.run(train, 0.1)
       ...:     lease.run(evaluate)
    Accepts the options of `gs.distributed`; `timeout` bounds each run."""
    run_options = validate_run_options(**options)
    from ..gateway.client import GATEWAY_ENV, gateway_path

    if gateway_path():
        raise GPUSessionError(
            f"gs.lease() is not available through the gpusession gateway yet ({GATEWAY_ENV} is set: this kernel "
            "reaches GPUs through the hub's service). Use @gs.distributed or %%gpu, which lease GPUs for each call.")
    # `timeout` bounds each run of a held lease, not the lease: declare no hold limit to the broker.
    run_options = dataclasses.replace(run_options, lease=dataclasses.replace(run_options.lease, max_hold_s=None))
    observer = default_observer(run_options.lease.workers)
    held = Lease(run_options, observer=observer).acquire()
    if run_options.lease.min_workers is not None and run_options.lease.min_workers < run_options.lease.workers:
        resize_while_idle(held)
    return held
