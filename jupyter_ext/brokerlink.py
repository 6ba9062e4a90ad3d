"""The server's side of the bridge (`jupyter_ext.bridge`): start it, send calls, match replies.

Calls return concurrent futures, so tornado handlers await them (asyncio.wrap_future) and the
server's event loop never waits on Ray.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from concurrent.futures import Future, InvalidStateError, TimeoutError
from pathlib import Path
from typing import Any

import jupyter_ext
from gpusession.errors import ERRORS_BY_NAME
from gpusession.cluster.localhead import terminate

IMPORT_ROOT = str(Path(jupyter_ext.__file__).resolve().parent.parent)


class BrokerUnavailable(RuntimeError):
    """The broker cannot be reached now (cluster starting, stopped, or unreachable)."""


def settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    try:
        future.set_exception(error) if error is not None else future.set_result(result)
    except InvalidStateError:  # the caller gave up (timeout) before the reply came
        pass


def _error(reply: dict) -> BaseException:
    kind, message = reply.get("type"), reply.get("message", "")
    if kind in ERRORS_BY_NAME:
        return ERRORS_BY_NAME[kind](message)
    return BrokerUnavailable(f"The broker did not answer: {message}")


class BrokerLink:
    def __init__(self, *, env: dict, policy: dict | None, log) -> None:
        self.env, self.policy, self.log = env, policy, log
        self.proc: subprocess.Popen | None = None
        self.ready: Future = Future()
        self.pending: dict[int, Future] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def start(self, *, timeout_s: float = 120.0) -> dict:
        """Start the bridge and wait until it reaches the broker; returns the broker's info."""
        args = [json.dumps(self.policy)] if self.policy else []
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyter_ext.bridge", *args], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     cwd=IMPORT_ROOT)  # `-m` imports from the cwd first: not the user's folder
        threading.Thread(target=self._read, name="gpusession-bridge-reader", daemon=True).start()
        try:
            return self.ready.result(timeout=timeout_s)
        except TimeoutError:
            self.stop(timeout_s=1.0)
            raise BrokerUnavailable(f"Could not reach the broker within {timeout_s:.0f} s: is the Ray cluster at "
                                    f"{self.env.get('RAY_ADDRESS')} up and reachable from this server?") from None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self.lock:
            if not self.alive:
                settle(future, error=BrokerUnavailable(self._gone()))
                return future
            request_id = next(self.ids)
            self.pending[request_id] = future
            try:
                message = {"id": request_id, "method": method, "args": args, **({"kwargs": kwargs} if kwargs else {})}
                self.proc.stdin.write(json.dumps(message) + "\n")
            except OSError:
                self.pending.pop(request_id, None)
                settle(future, error=BrokerUnavailable(self._gone()))
        return future

    def stop(self, *, timeout_s: float = 5.0) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()  # the bridge exits at the end of its input
            self.proc.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            terminate(self.proc.pid, timeout_s=timeout_s)
            self.proc.wait()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                self.log.warning("gpusession bridge wrote a line that is not JSON: %r", line[:200])
                continue
            if "ready" in reply or "failed" in reply:
                failure = reply.get("failed")
                settle(self.ready, result=reply.get("ready"),
                        error=BrokerUnavailable(f"Could not reach the broker: {failure}") if failure else None)
                continue
            with self.lock:
                future = self.pending.pop(reply.get("id"), None)
            if future is not None:
                error = _error(reply["error"]) if "error" in reply else None
                settle(future, result=reply.get("result"), error=error)
        self.proc.wait()
        gone = BrokerUnavailable(self._gone())
        settle(self.ready, error=gone)
        with self.lock:
            waiting, self.pending = list(self.pending.values()), {}
        for future in waiting:
            settle(future, error=gone)

    def _gone(self) -> str:
        code = self.proc.poll() if self.proc else None
        return (f"The gpusession bridge (pid {self.proc.pid if self.proc else '-'}) has exited "
                f"(status {code}); gpusession starts a new one on the next request. The server's log has the cause.")
