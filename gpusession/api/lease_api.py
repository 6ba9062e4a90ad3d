"""`gs.lease(...)`: GPUs held across several runs until released (a `with` block, or
`release()`), where `@gs.distributed` holds them for one call. The lease itself (broker
protocol, placement group) is run/caller/lease.py; this is what a user calls. Under `gpusession
hub` (GPUSESSION_GATEWAY set) the gateway holds the lease for this kernel (gateway/remotelease.py)."""
from __future__ import annotations

from typing import Any

from ..run.caller.options import for_held_lease, validate_run_options
from ..observe.renderer import default_observer


def lease(**options: Any):
    """Lease GPUs now (waiting in the queue if needed) and hold them until released.

    In [1]: with gs.lease(gpus=2) as lease:
       ...:     lease.run(train, 0.1)
       ...:     lease.run(evaluate)
    Accepts the options of `gs.distributed`; `timeout` bounds each run. Under `gpusession hub`
    the hub's gateway holds the GPUs for this kernel (the same object's API; the kernel imports
    no Ray), and gives them back when the kernel releases them or dies."""
    run_options = for_held_lease(validate_run_options(**options))
    observer = default_observer(run_options.lease.workers)
    from ..gateway.client import gateway_path

    if gateway_path():
        from ..gateway.remotelease import hold_through_gateway

        return hold_through_gateway(run_options, observer)
    from ..run.caller.lease import Lease
    from ..run.caller.idle_resize import resize_while_idle

    held = Lease(run_options, observer=observer).acquire()
    resize_while_idle(held)
    return held
