"""Tells the broker how far a run got (its latest `gs.report` step), at most a few times a second,
so JupyterLab's GPUs sidebar and status bar show a live step for every run of every kernel.

An Observer beside the cell's renderer. It never waits on the broker and never fails a run: a
display is not worth a slower step, so each report is sent without waiting and its answer is
collected (and dropped) at the next send or at the end of the run.
"""
from __future__ import annotations

import time
from numbers import Integral

from ...observe.events import Observer, RunInfo
from ...identity import Identity

MIN_INTERVAL_S = 0.25  # the sidebar polls every 0.4 s: more often would change nothing it shows


def step_of(metrics: dict, info: RunInfo) -> int:
    """PURE: the report's own `step` when it is a whole number >= 0, else how many reports came so far."""
    step = metrics.get("step")
    if isinstance(step, Integral) and not isinstance(step, bool) and step >= 0:
        return int(step)
    return len(info.history)


class StepToBroker(Observer):
    def __init__(self, identity: Identity | None = None) -> None:
        self.identity = identity
        self.sent_at = 0.0
        self.pending: list = []  # answers not yet collected

    def report(self, metrics: dict, info: RunInfo) -> None:
        now = time.monotonic()
        if info.lease_id is None or now - self.sent_at < MIN_INTERVAL_S:
            return
        self.sent_at = now
        try:
            from ...broker import client  # Ray is imported only once a run reports

            self._collect()
            handle = client.broker()
            self.pending.append(handle.progress.remote(info.lease_id, step_of(metrics, info),
                                                       auth=client.lease_auth(self.identity)))
        except Exception:  # noqa: BLE001 - a display only: the run goes on without it
            self.pending.clear()

    def finished(self, info: RunInfo, error: BaseException | None) -> None:
        self._collect()

    def _collect(self) -> None:
        """Take the answers that came (an unretrieved failed answer would be printed by Ray)."""
        import ray

        if not self.pending:
            return
        ready, self.pending = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        for answer in ready:
            try:
                ray.get(answer)
            except Exception:  # noqa: BLE001 - e.g. a lease revoked meanwhile: nothing to show
                pass
