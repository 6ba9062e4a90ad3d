"""A live run keeps its server active (issue 32), so the hub's idle culler never stops a server
whose kernel is training: behind the gateway (`gpusession hub`), every `run_activity_s` the server
asks the gateway which processes of its account follow a live run (gpusession.gateway.following);
when one of them is this server or runs under it (a kernel, a script in a terminal), the server
records activity now.

Where it records it: jupyter_server's `ServerWebApplication.last_activity()` is the latest of the
server's start, its kernels' and terminals' activity, API requests, and every web app setting whose
name ends in `_last_activity` (its documented hook for extensions). jupyterhub-singleuser reports
that time to the Hub every JUPYTERHUB_ACTIVITY_INTERVAL seconds, and jupyterhub-idle-culler culls
by the Hub's record. So this module sets `gpusession_last_activity`, and nothing else.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

SETTING = "gpusession_last_activity"
MAX_DEPTH = 64  # parents walked from a process up to the server (a kernel is one step, a script two or three)


def is_under(pid: int, ancestor: int, parent_of: Callable[[int], int | None]) -> bool:
    """PURE over `parent_of`: whether `pid` is `ancestor` or one of its descendants."""
    for _ in range(MAX_DEPTH):
        if pid == ancestor:
            return True
        parent = parent_of(pid)
        if parent is None or parent <= 1 or parent == pid:
            return False
        pid = parent
    return False


def any_under(pids: Iterable[int], ancestor: int, parent_of: Callable[[int], int | None]) -> bool:
    return any(is_under(pid, ancestor, parent_of) for pid in pids)


def parent_of(pid: int) -> int | None:
    """The parent of a running process (from /proc), None when it is gone or unreadable."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


class RunActivity:
    """The loop that asks the gateway and records activity; `check()` is one round."""

    def __init__(self, backend, settings: dict, *, interval_s: float, server_pid: int, log) -> None:
        self.backend, self.settings, self.interval_s = backend, settings, interval_s
        self.server_pid, self.log = server_pid, log
        self.live = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self.backend.gateway and self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def check(self) -> bool:
        """Ask once; record activity when a run of a process under this server goes on."""
        answer = await self.backend.call("following")
        pids = [pid for pid in (answer or {}).get("pids", []) if isinstance(pid, int)]
        live = any_under(pids, self.server_pid, parent_of)
        if live:
            self.settings[SETTING] = datetime.now(timezone.utc)
        if live != self.live:
            self.log.info("gpusession: %s", "a live run of a kernel here counts as activity" if live
                          else "no run of a kernel here goes on any more; activity is Jupyter's own again")
            self.live = live
        return live

    async def _loop(self) -> None:
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the gateway restarting, the cluster starting: ask again next round
                self.log.debug("gpusession: could not ask the gateway for live runs: %s", exc)
            await asyncio.sleep(self.interval_s)
