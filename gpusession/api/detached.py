"""Runs that outlive the kernel (issue 32), the notebook's side: `fn.submit(..., detach=True)`
hands the run to a gpusession gateway, which hosts it past this kernel; `gs.attach(run_id)`
follows one from any kernel of the same account; `gs.runs(all=True)` lists them.

Under `gpusession hub` the hub's gateway hosts them; for one user (`gpusession lab`, a kernel or
script with RAY_ADDRESS) a gateway of that user's own, started by the first detach
(gpusession/gateway/usergateway.py). The embedded cluster (a head inside the kernel) ends with its
kernel: `detach=True` is refused there. A gateway keeps what a run leaves in memory (see
gpusession/gateway/keeping.py): lost when it exits.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

from ..errors import GPUSessionError
from ..gateway.keeping import Detach
from ..observe.events import Observer, RunInfo
from .background import Run

# how long `run.run_id` waits for a gateway to take a just-submitted run (a user's own gateway may
# have to start first); the run's end, taken or not, ends the wait
RUN_ID_WAIT_S = 360.0


def detach_limit(max_duration: Any) -> Detach:
    """A detached run with its time limit (none named: the gateway applies its admin's default),
    or the error that says why it cannot be detached here
    (ValueError: the limit; GPUSessionError: the embedded cluster, which ends with this kernel)."""
    from ..gateway.client import gateway_path
    from ..gateway.keeping import detach_policy_from_env, max_duration_of
    from ..gateway.usergateway import cluster_address, detach_refusal

    limit = Detach(None if max_duration is None else max_duration_of(max_duration))
    hub = gateway_path()
    refusal = None if hub else detach_refusal(cluster_address())
    if refusal:
        raise GPUSessionError(refusal)
    if not hub:  # this user's own gateway keeps to the policy these variables set: a bad one is said now
        detach_policy_from_env(os.environ)
    return limit


class DetachedRun(Run):
    """A `Run` the gateway hosts: the same handle (state, metrics, result(), cancel()), plus
    `run_id`, what `gs.attach(run_id)` takes in any kernel of the same account."""

    def __init__(self, name: str, start: Callable[[Observer, RunInfo], Any], observer: Observer, *,
                 run_id: str | None = None) -> None:
        super().__init__(name, start, observer)
        self._run_id = run_id
        self._known = threading.Event()
        if run_id is not None:
            self._known.set()

    def _noted(self, fields: dict) -> None:
        self._run_id = fields.get("run_id") or (fields.get("run") or {}).get("run_id")
        self._known.set()

    def _end(self, error: BaseException | None) -> None:
        super()._end(error)
        self._known.set()

    @property
    def run_id(self) -> str | None:
        """The gateway's id of the run (waits for the gateway to take it; None if it never did)."""
        self._known.wait(RUN_ID_WAIT_S)
        return self._run_id

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", detached {self._run_id or '(not yet taken)'}>"


def attach(run_id: str, *, handle: type[DetachedRun] = DetachedRun, **extra: Any) -> DetachedRun:
    """Follow a detached run of yours from this kernel: its live view from the start (metrics,
    output so far), then live; `.result()` is its value, `.cancel()` stops it. Raises at once when
    the gateway keeps no such run of yours (gs.runs(all=True) lists them). (`handle`, `extra`:
    the handle's class and its own arguments, as %%gpu --attach's.)"""
    from ..gateway.reattach import follow_attached, open_attach
    from ..observe.renderer import default_observer
    from ..run.endings import told_when_ended

    conn, path, record = open_attach(run_id)
    observer = default_observer(record.workers, background=True)

    def start(run_observer: Observer, info: RunInfo) -> Any:
        with told_when_ended(info, run_observer):
            return follow_attached(conn, path, record, info, run_observer)

    try:
        return handle(record.name, start, observer, run_id=record.run_id, **extra)._begin()
    except BaseException:
        conn.close()
        raise
