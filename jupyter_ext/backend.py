"""What the server holds for gpusession: the cluster (and the local head, if it started one), the
bridge to the broker, the admin token and the identity key; and the credentials each caller gets.

Bringing the cluster up takes seconds (a `ray start` alone ~10 s), so it runs on a thread;
handlers and kernel starts await `connected` and never block the event loop.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from gpusession import localhead
from gpusession.identity import SIGNATURE_ENV, USER_ENV, sign
from gpusession.raycluster import state_dir

from . import bringup
from .brokerlink import BrokerLink, BrokerUnavailable, settle
from .config import GPUSession

CALL_TIMEOUT_S = bringup.CALL_TIMEOUT_S
RETRY_AFTER_S = 15.0


@dataclass(frozen=True)
class Connection:
    ray_env: dict  # RAY_ADDRESS (and RAY_AUTH_MODE for a local head): how kernels reach the cluster
    info: dict  # the broker's version, db_path, policy, and the Ray address the bridge joined
    admin_token: str | None
    signing_key: bytes | None


class Backend:
    def __init__(self, options: GPUSession, *, owner: str, log) -> None:
        self.options, self.owner, self.log = options, owner, log
        self.head: localhead.LocalHead | None = None  # only a head this server started
        self.link: BrokerLink | None = None
        self.connected: Future = Future()
        self.failed_at = 0.0
        self.stopping = False
        self.lock = threading.Lock()
        atexit.register(self.stop)  # a server that exits early (bad flag, Ctrl-C) still stops its head

    def start(self) -> None:
        """Bring the cluster up on a thread (not a daemon: the interpreter lets it finish, then stop()
        runs at exit, so a head started during shutdown is stopped too)."""
        threading.Thread(target=self._bring_up, name="gpusession-bring-up").start()

    async def connection(self, *, wait_s: float = 5.0) -> Connection:
        if self.connected.done() and self.connected.exception() and time.monotonic() - self.failed_at > RETRY_AFTER_S:
            with self.lock:
                self.connected = Future()
            self.start()
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.connected)), wait_s)
        except asyncio.TimeoutError:
            raise BrokerUnavailable("gpusession is still starting the Ray head and the broker; "
                                    "try again in a few seconds.") from None

    async def call(self, method: str, *args):
        await self.connection()
        if not self.link.alive:
            await asyncio.to_thread(self._relink)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.link.call(method, *args)), CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise BrokerUnavailable(f"The broker did not answer {method} within {CALL_TIMEOUT_S:.0f} s; "
                                    "it may be overloaded or restarting. Try again.") from None

    async def auth_for(self, user: str) -> dict:
        """Admins act with the admin token; everyone else with their own server-signed name.

        A server without the signing key (a JupyterHub user server: the Hub signed its owner's
        name at spawn, see cluster/jupyterhub-values.yaml) can vouch only for its owner."""
        conn = await self.connection()
        if user in self.options.admin_users and conn.admin_token:
            return {"user": user, "token": conn.admin_token, "by": user}
        if conn.signing_key:
            return {"user": user, "signature": sign(user, conn.signing_key)}
        return {"user": user, "signature": os.environ.get(SIGNATURE_ENV) if user == self.owner else None}

    async def server_auth(self) -> dict | None:
        conn = await self.connection()
        return {"user": self.owner, "token": conn.admin_token} if conn.admin_token else None

    async def kernel_env(self) -> dict:
        """Environment for a kernel of this server: the cluster, its user, that user's signature."""
        try:
            conn = await self.connection(wait_s=180.0)
        except BrokerUnavailable as exc:
            self.log.warning("Starting a kernel without gpusession's cluster settings: %s", exc)
            return {}
        env = {**conn.ray_env, USER_ENV: self.owner}
        if conn.signing_key:
            env[SIGNATURE_ENV] = sign(self.owner, conn.signing_key)
        if self.options.embedded:
            env["GPUSESSION_HOME"] = str(state_dir())
        return env

    def stop(self) -> None:
        """Stop what this server started: the bridge, and the local head if it started it."""
        self.stopping = True
        if self.link is not None:
            self.link.stop()
        if self.head is not None:
            self.log.info("Stopping the local Ray head at %s (pid %d)", self.head.address, self.head.pid)
            if localhead.stop(pid=self.head.pid) is None:
                localhead.terminate(self.head.pid, timeout_s=30)
            self.head = None

    def _bring_up(self) -> None:
        try:
            settle(self.connected, result=self._connect())
        except Exception as exc:  # shown to every caller until a retry succeeds
            self.failed_at = time.monotonic()
            self.log.error("gpusession could not reach its cluster: %s", exc)
            settle(self.connected, error=exc if isinstance(exc, BrokerUnavailable) else BrokerUnavailable(str(exc)))

    def _connect(self) -> Connection:
        ray_env, started = bringup.cluster_env(self.options, self.log)
        self.head = started or self.head  # a retry finds the head an earlier attempt started
        self._unless_stopping()
        policy = self.options.broker_policy() if self.options.embedded else None
        if policy is not None and self.options.require_signed_identity is None:
            policy["require_signed_identity"] = True  # this server signs every kernel it starts: check it
        self.link = BrokerLink(env={**os.environ, **ray_env}, policy=policy, log=self.log)
        info = self.link.start()
        self._unless_stopping()
        token, key = bringup.credentials(self.link, self.options, self.owner, info, self.log)
        self.log.info("gpusession: broker %s (ledger %s), Ray at %s",
                      info["version"], info["ledger_id"], info["address"])
        return Connection(ray_env, info, token, key)

    def _unless_stopping(self) -> None:
        if self.stopping:  # the server shut down while we were starting: stop what we just started
            self.stop()
            raise BrokerUnavailable("The Jupyter server is shutting down.")

    def _relink(self) -> None:
        with self.lock:
            if self.link.alive:
                return
            self.log.warning("The gpusession bridge had exited; starting a new one.")
            self.link = BrokerLink(env=self.link.env, policy=self.link.policy, log=self.log)
            self.link.start()
