"""The steps of reaching the cluster, each blocking (the backend runs them on a thread): where
the cluster is (starting the local head for ray_address "local"), and the admin credentials."""
from __future__ import annotations

from gpusession.cluster import localhead
from gpusession.broker.storage.secrets import admin_token_path
from gpusession.errors import NotAuthorized

from .brokerlink import BrokerLink
from .config import GPUSession

CALL_TIMEOUT_S = 35.0


def cluster_env(options: GPUSession, log, *, spawned=None) -> tuple[dict, localhead.LocalHead | None]:
    """How the bridge and kernels reach the cluster; and the local head, if this call started it."""
    if not options.embedded:
        ignored = sorted(options.broker_policy())
        if ignored:
            log.warning("Ignoring c.GPUSession.%s: cluster policy belongs to the broker of %s, "
                        "which this server did not start.", ", ".join(ignored), options.ray_address)
        return {"RAY_ADDRESS": options.ray_address}, None
    head, started = localhead.start(gpus=options.local_gpus or None, spawned=spawned)
    log.info("%s %s", "Started" if started else "Using the already running", head.describe())
    return head.client_env(), head if started else None


def credentials(link: BrokerLink, options: GPUSession, owner: str, info: dict, log) -> tuple[str | None, bytes | None]:
    """The admin token (configured, or the file beside a ledger on this machine) and the identity key."""
    # The broker tells no one where its ledger is; a server on the head node looks where a
    # broker it started (or the default one) keeps it.
    token = options.admin_token or _token_beside(info.get("ledger_here"))
    if token:
        try:
            key = link.call("signing_key", {"user": owner, "token": token}).result(CALL_TIMEOUT_S)
            return token, key.encode()
        except NotAuthorized:
            log.error("c.GPUSession.admin_token is not the admin token of the broker at %s; copy it from the "
                      "file admin_token beside that broker's ledger on its head node.", info["address"])
    log.warning("gpusession has no valid admin token for the broker at %s: the admin page is read-only "
                "and kernels carry unsigned identities. Set c.GPUSession.admin_token.", info["address"])
    return None, None


def _token_beside(db_path: str | None) -> str | None:
    if not db_path:
        return None
    try:
        return admin_token_path(db_path).read_text().strip() or None
    except OSError:  # the ledger is on another machine
        return None
