"""What the server holds for gpusession: the cluster (and the local head, if it started one), the
bridge to the broker, the admin token and the identity key; and the credentials each caller gets.

Bringing the cluster up takes seconds (a `ray start` alone ~10 s, minutes on a loaded machine),
so it runs on a thread, started once the server really runs (a server that refuses to start,
e.g. as root without --allow-root, never starts a head) or at the first request. Until it is up,
requests get at once a clean "starting the cluster (N s)" state; a failed start gives one readable
line (the server's log has the cause) and is retried by a later request. Nothing here wraps the
bring-up's future in an asyncio future, so a failure never leaves an unretrieved exception.

Behind a gateway (GPUSESSION_GATEWAY set: a `gpusession hub` user server) there is nothing to
bring up: the link is the gateway's broker session (gatewaylink.py), the server holds no token
and no key, and kernels get the gateway's socket instead of Ray's address.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from gpusession.cluster import localhead
from gpusession.gateway.client import GATEWAY_ENV, gateway_path
from gpusession.identity import SIGNATURE_ENV, USER_ENV, sign

# This server holds the key itself (it runs beside the broker): its kernels' signatures last as
# long as a kernel might; the short-lived ones are the Hub's, for servers elsewhere (spawnhook.py).
SERVER_SIGNED_FOR_S = 365 * 24 * 3600
from gpusession.cluster.where import state_dir

from . import bringup
from .brokerlink import BrokerLink, BrokerUnavailable, settle
from .config import GPUSession
from .gatewaylink import GatewayLink

CALL_TIMEOUT_S = bringup.CALL_TIMEOUT_S
RETRY_AFTER_S = 15.0
POLL_S = 0.05


class ClusterStarting(BrokerUnavailable):
    """The server is still bringing up its cluster; the answer says for how long so far."""

    def __init__(self, elapsed_s: float) -> None:
        super().__init__(f"gpusession is starting the cluster ({elapsed_s:.0f} s); "
                         "this page retries by itself.")
        self.details = {"state": localhead.Bringup.STARTING, "elapsed_s": round(elapsed_s)}


def readable(exc: BaseException) -> str:
    """One line for a user: what failed, and the exception a log tail or traceback ends with,
    if any (the whole cause goes to the server's log)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    what = (lines[0] if lines else type(exc).__name__).rstrip(":.")
    causes = [line for line in lines[1:] if CAUSE.match(line)]
    cause = f" ({_clip(causes[-1], 200)})" if causes else ""
    return f"gpusession could not start its cluster: {_clip(what, 300)}{cause}. The server's log has the details."


CAUSE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt|Timeout)\b")  # "ValueError: ...", "ray.exceptions.X..."


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Connection:
    ray_env: dict  # RAY_ADDRESS (and RAY_AUTH_MODE for a local head), or GPUSESSION_GATEWAY: how kernels reach it
    info: dict  # the broker's version, db_path, policy, and the Ray address the bridge joined
    admin_token: str | None
    signing_key: bytes | None


class Backend:
    def __init__(self, options: GPUSession, *, owner: str, log, announce=None) -> None:
        self.options, self.owner, self.log = options, owner, log
        self.announce = announce  # called with the cluster's environment once it is up
        self.head: localhead.LocalHead | None = None  # only a head this server started
        self.gateway = gateway_path()  # the gateway's socket when this server runs behind one
        self.link: BrokerLink | GatewayLink | None = None
        self._connected: Future = Future()
        self._started = False
        self.started_at = time.monotonic()
        self.failed_at = 0.0
        self.stopping = False
        self.lock = threading.Lock()
        atexit.register(self.stop)  # a server that exits early (bad flag, Ctrl-C) still stops its head

    @property
    def connected(self) -> Future:
        """The bring-up's outcome (a Connection, or a BrokerUnavailable); starts it if need be."""
        self.start()
        return self._connected

    def start(self) -> None:
        """Bring the cluster up on a thread, once. A daemon thread: a server that exits meanwhile
        does not wait for the head to come up, and stop() ends the head it already spawned."""
        with self.lock:
            if self._started or self.stopping:
                return
            self._started, self.started_at = True, time.monotonic()
        threading.Thread(target=self._bring_up, name="gpusession-bring-up", daemon=True).start()

    async def connection(self, *, wait_s: float = 1.0) -> Connection:
        """The connection; ClusterStarting if it is not up within wait_s, the failure if it failed."""
        future = self.connected
        if future.done() and future.exception() and time.monotonic() - self.failed_at > RETRY_AFTER_S:
            with self.lock:
                self._connected, self._started = Future(), False
            future = self.connected
        deadline = time.monotonic() + wait_s
        while not future.done():
            if time.monotonic() >= deadline:
                raise ClusterStarting(time.monotonic() - self.started_at)
            await asyncio.sleep(POLL_S)
        return future.result()

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
        if self.gateway:  # the gateway acts for the account its socket names; nothing to send
            return {"user": user}
        if user in self.options.admin_users and conn.admin_token:
            return {"user": user, "token": conn.admin_token, "by": user}
        if conn.signing_key:
            return {"user": user, "signature": sign(user, conn.signing_key, valid_for_s=SERVER_SIGNED_FOR_S)}
        return {"user": user, "signature": os.environ.get(SIGNATURE_ENV) if user == self.owner else None}

    async def server_auth(self) -> dict | None:
        conn = await self.connection()
        if self.gateway:  # admin rights are the gateway's to check
            return {"user": self.owner} if self.owner in self.options.admin_users else None
        return {"user": self.owner, "token": conn.admin_token} if conn.admin_token else None

    async def kernel_env(self) -> dict:
        """Environment for a kernel of this server: the cluster, its user, that user's signature."""
        try:
            conn = await self.connection(wait_s=300.0)
        except BrokerUnavailable as exc:
            self.log.warning("Starting a kernel without gpusession's cluster settings: %s", exc)
            return {}
        env = {**conn.ray_env, USER_ENV: self.owner}
        if conn.signing_key:
            env[SIGNATURE_ENV] = sign(self.owner, conn.signing_key, valid_for_s=SERVER_SIGNED_FOR_S)
        if self.options.embedded and not self.gateway:
            env["GPUSESSION_HOME"] = str(state_dir())
        return env

    def stop(self) -> None:
        """Stop what this server started: the bridge, and the local head if it started it."""
        self.stopping = True
        if self.link is not None:
            self.link.stop()
        if self.head is not None:
            self.log.info("Stopping the local Ray head at %s (pid %d)", self.head.address, self.head.pid)
            if localhead.stop(pid=self.head.pid) is None:  # no longer recorded: still ours to stop
                localhead.end(self.head, timeout_s=30)
            self.head = None

    def _bring_up(self) -> None:
        future = self._connected
        try:
            settle(future, result=self._connect())
        except Exception as exc:  # one readable line to every caller until a retry succeeds
            self.failed_at = time.monotonic()
            self.log.error("gpusession could not start its cluster: %s", exc)  # the whole cause
            error = BrokerUnavailable(readable(exc))
            error.details = {"state": localhead.Bringup.FAILED}
            settle(future, error=error)

    def _spawned(self, head: localhead.LocalHead) -> None:
        """Called as soon as `ray start` runs, before it is ready: stop() can end it from then on."""
        self.head = head
        if self.stopping:
            self.stop()

    def _connect(self) -> Connection:
        if self.gateway:
            return self._connect_gateway()
        ray_env, started = bringup.cluster_env(self.options, self.log, spawned=self._spawned)
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
        if self.announce is not None:
            try:
                self.announce(ray_env)
            except OSError as exc:  # only the CLI's shortcut is lost
                self.log.warning("gpusession could not write its announcement for the CLI: %s", exc)
        return Connection(ray_env, info, token, key)

    def _connect_gateway(self) -> Connection:
        self.link = GatewayLink(self.gateway, log=self.log)
        info = self.link.start()
        self._unless_stopping()
        self.log.info("gpusession: broker %s (ledger %s) through the gateway at %s",
                      info.get("version"), info.get("ledger_id"), self.gateway)
        return Connection({GATEWAY_ENV: self.gateway}, info, None, None)

    def _unless_stopping(self) -> None:
        if self.stopping:  # the server shut down while we were starting: stop what we just started
            self.stop()
            raise BrokerUnavailable("The Jupyter server is shutting down.")

    def _relink(self) -> None:
        with self.lock:
            if self.link.alive:
                return
            if self.gateway:
                self.log.warning("The connection to the gpusession gateway had closed; opening a new one.")
                self.link = GatewayLink(self.gateway, log=self.log)
            else:
                self.log.warning("The gpusession bridge had exited; starting a new one.")
                self.link = BrokerLink(env=self.link.env, policy=self.link.policy, log=self.log)
            self.link.start()
