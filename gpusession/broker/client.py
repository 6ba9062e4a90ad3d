"""Find (or start) the cluster's broker actor and call it.

A broker older than this client is replaced only by an admin (a client that holds the admin
token); anyone else keeps using it while it speaks our protocol, or is told who can upgrade it.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray
from packaging.version import Version
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._version import __version__
from ..cluster import rayprivate
from ..errors import BrokerOutdated, GPUSessionError, NotAuthorized
from ..identity import Identity, current_identity
from ..cluster.raycluster import ensure_connected, head_node_id, state_dir
from .protocol.request import PROTOCOL
from .storage.secrets import admin_token_path
from .storage import statedir
from .service.settings import BrokerConfig, explicit_db_path

log = logging.getLogger("gpusession")

BROKER_NAME = "gpusession-broker"
NAMESPACE = "gpusession"
_CALL_TIMEOUT_S = 60.0
# The first answer of a broker this client may just have started: Ray starts a process for it and
# the broker imports gpusession and reads its ledger. Seen on the loaded 2-core test machine
# (load 16-34): 61 s (35 s for Ray to start the process, 27 s in the constructor); with the plain
# call timeout, the thread that started it failed with GetTimeoutError while the broker came up.
_START_TIMEOUT_S = 300.0
ADMIN_TOKEN_ENV = "GPUSESSION_ADMIN_TOKEN"
_REPLACEMENTS = 3  # an admin's client replaces an older broker at most this often in one lookup
# Reentrant: broker() holds it while it checks the broker's version through call(), and call()
# takes it again (forget(), then broker()) when that broker died meanwhile; a plain Lock deadlocked
# that thread, and every other thread of the kernel waiting for a handle behind it.
_lock = threading.RLock()
_cached: tuple[str, Any] | None = None  # (ray job id, handle)


def call(method, *args: Any, timeout: float | None = _CALL_TIMEOUT_S, **kwargs: Any) -> Any:
    """Call a broker method and wait; a domain error raised remotely is raised here as itself.

    Calls survive a broker restart: Ray retries them on the restarted actor (every method is
    idempotent, and `request` is deduplicated by its request_id)."""
    try:
        try:
            return ray.get(method.options(max_task_retries=-1).remote(*args, **kwargs), timeout=timeout)
        except ray.exceptions.RayActorError:
            # The broker was replaced (a newer client killed it for good): find the new one, once.
            forget()
            fresh = getattr(broker(), method._method_name)
            return ray.get(fresh.options(max_task_retries=-1).remote(*args, **kwargs), timeout=timeout)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, (GPUSessionError, ValueError, TypeError, KeyError)):
            raise cause from None
        raise


def broker(config: BrokerConfig | None = None) -> Any:
    """The broker's handle; started on the head node if the cluster has none."""
    global _cached
    ensure_connected()
    job = ray.get_runtime_context().get_job_id()
    with _lock:
        if _cached is not None and _cached[0] == job:
            return _cached[1]
        handle = _get_or_create(config or BrokerConfig())
        _cached = (job, handle)
        return handle


def forget() -> None:
    """Drop the cached handle (after the broker was replaced or Ray restarted)."""
    global _cached
    with _lock:
        _cached = None


def lease_auth(identity: Identity | None = None) -> dict:
    """The credentials of this kernel for the broker's lease methods: its user (signed by the
    Jupyter server where it can sign) and its Ray job, which owns the leases it asks for."""
    identity = identity or current_identity()
    return {"user": identity.user, "signature": identity.signature,
            "job_id": ray.get_runtime_context().get_job_id()}


def admin_token_here() -> str | None:
    """The admin token, if this process may have it: $GPUSESSION_ADMIN_TOKEN, else the file
    beside this cluster's ledger when it is on this machine and readable (an admin on the head)."""
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return token
    ledger = ledger_path_here()
    try:
        return admin_token_path(ledger).read_text().strip() or None if ledger else None
    except OSError:
        return None


def ledger_path_here(db_path: str | None = None) -> str | None:
    """Where this cluster's ledger is when this process runs on its head: `db_path` or
    $GPUSESSION_DB_PATH if set, else the ledger path or the directory the cluster's broker
    recorded (statedir.py)."""
    explicit = explicit_db_path(BrokerConfig(db_path=db_path))
    if explicit:
        return explicit
    ensure_connected()
    recorded_ledger = statedir.recorded_explicit_ledger()
    if recorded_ledger is not None:
        return recorded_ledger
    recorded = statedir.recorded_here()
    if recorded is not None:
        return str(recorded / statedir.LEGACY_LEDGER)
    legacy = state_dir() / statedir.LEGACY_LEDGER  # a broker from before per-cluster directories
    return str(legacy) if legacy.exists() else None


def _get_or_create(config: BrokerConfig, *, replacements: int = _REPLACEMENTS) -> Any:
    handle = _create(config)
    running = call(handle.version, timeout=_START_TIMEOUT_S)
    if Version(running) >= Version(__version__):
        return handle
    # (replacements run out: older kernels keep starting their own; it is used as any client would)
    db_path = _retire(handle, admin_token_here()) if replacements > 0 else None
    if db_path is not None:
        log.warning("Replacing broker %s with %s (ledger kept)", running, __version__)
        ray.kill(handle, no_restart=True)
        _wait_until_gone()
        # Another process whose call found the old broker gone may start one of its own code in
        # this moment (its client re-creates a missing broker): ours then gets that one, so the
        # version is checked again, and an older one replaced again.
        return _get_or_create(BrokerConfig(db_path=db_path), replacements=replacements - 1)
    protocol = call(handle.info).get("protocol", 1)
    if protocol == PROTOCOL:
        log.info("The cluster's broker runs gpusession %s (this client: %s); using it. An admin can upgrade "
                 "it by running gpusession with %s set.", running, __version__, ADMIN_TOKEN_ENV)
        return handle
    raise BrokerOutdated(
        f"The cluster's broker runs gpusession {running} (protocol {protocol}) but this client, {__version__}, "
        f"needs protocol {PROTOCOL}. Only an admin can upgrade the broker: someone holding its admin token (the "
        f"file admin_token beside the ledger on the head node) runs any gpusession command with {ADMIN_TOKEN_ENV} "
        f"set. Until then use gpusession {running} in this kernel."
    )


def _retire(handle: Any, token: str | None) -> str | None:
    """Ask the running broker to step down for an admin; its ledger path, or None if not allowed."""
    if not token:
        return None
    auth = {"token": token, "user": "admin"}
    try:
        try:
            return call(handle.retire, auth)["db_path"]
        except AttributeError:  # a broker from before `retire`: the token check is signing_key
            call(handle.signing_key, auth)
            return call(handle.info)["db_path"]
    except NotAuthorized:
        log.warning("%s is not this broker's admin token; not replacing it.", ADMIN_TOKEN_ENV)
        return None


def _create(config: BrokerConfig) -> Any:
    from .service.service import BrokerService

    actor_class = ray.remote(BrokerService)
    return actor_class.options(
        name=BROKER_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=-1,
        num_cpus=0,
        max_concurrency=10_000,  # long polls and watches are parked coroutines, not threads
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
        runtime_env=_code_of_this_client(),
    ).remote(config.to_dict())


def _code_of_this_client() -> dict:
    """Ship this client's gpusession to the broker, so a replacement really runs the new code.

    Ray uploads local py_modules only for whole jobs, so the package is uploaded here through
    Ray's own helper and the actor gets the resulting gcs:// URI (a detached actor keeps it
    referenced). If that helper is unavailable the broker runs the head node's installed copy."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpusession/

    try:
        return rayprivate.upload_package(package_dir, log)
    except Exception as exc:  # a Ray without this helper: fall back to the installed copy
        log.warning("Could not ship gpusession %s to the broker (%s); using the head's copy.", __version__, exc)
        return {}


def _wait_until_gone(timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(BROKER_NAME, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)
    raise GPUSessionError(f"The old broker did not stop within {timeout_s:.0f} s; try again.")
