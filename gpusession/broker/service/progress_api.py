"""The broker's method for a run's live step: the holder of a lease says which step it reached,
so JupyterLab's sidebar and status bar can show it. A mixin of BrokerService (service.py), like
ResizeMethods. Kept in memory only (a display, not a record): a restarted broker shows no step
until the next report, and nothing here touches the ledger or the lease's version.
"""
from __future__ import annotations

from ..protocol import request as checks
from .door import door
from ..policy.states import ACTIVE_STATES

MAX_STEP = 2**62


class ProgressMethods:
    steps: dict[int, int]  # lease id -> the last step its holder reported, for open leases only

    @door
    async def progress(self, lease_id: int, step: int, *, auth: dict) -> None:
        """The lease's holder reached `step`; a lease that ended meanwhile is ignored (its last
        reports may cross its release), anything not the owner's or not a whole step is refused."""
        row = await self._owned(lease_id, auth, "report the progress of")
        step = checks.whole(step, "step", low=0, high=MAX_STEP)
        if row["state"] in ACTIVE_STATES:
            self.steps[row["id"]] = step
        self.steps = {lease: at for lease, at in self.steps.items() if lease in self.books.rows}
