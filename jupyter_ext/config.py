"""The server's gpusession settings: `c.GPUSession.<name>` in jupyter_server_config.py, or
`--GPUSession.<name>=...` on the command line. Bad values are rejected when the server loads."""
from __future__ import annotations

import math
import os
import re

from traitlets import Bool, Dict, Float, Int, Set, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from gpusession.broker.policy.model import Priority, Quota
from gpusession.broker.service.settings import parse_quota_update
from gpusession.identity import current_user

ADDRESS = re.compile(r"^(local|auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")
POLICY_TRAITS = ("db_path", "default_quota", "allow_borrowing", "preemption_grace_s", "require_signed_identity")


class GPUSession(LoggingConfigurable):
    ray_address = Unicode(help="""The Ray cluster gpusession uses. "local" (the default when
        RAY_ADDRESS is unset): start a Ray head on this machine as a `ray start` subprocess (or reuse
        one started by `gpusession cluster start`), start the broker there, stop them at shutdown.
        Otherwise the address of a running cluster, e.g. "10.0.0.5:6379" or "ray://head:10001";
        "auto" finds a cluster started on this machine. Kernels started by this server get it as
        RAY_ADDRESS. This does not keep anyone from reaching Ray by other means: Ray has no
        per-user access control (see docs/admin/security.md).""").tag(config=True)
    local_gpus = Int(0, help="""Logical GPUs (a count) the embedded head declares when this
        machine has no GPU, e.g. 4; then workers train on the CPU with gloo and the admin page says
        the GPUs are logical. 0: the default of 4. Ignored on a machine with GPUs (all of them are
        used) and when ray_address is not "local". It is not a limit on anyone's use: quotas are.""").tag(config=True)
    admin_users = Set(Unicode(), help="""Jupyter user names that may open the admin page, see
        every lease, revoke any lease and change quotas, e.g. {"alice", "bob"}. Empty (the default)
        with ray_address "local": only this server's owner (GPUSESSION_USER, JUPYTERHUB_USER or the
        OS user); with a remote cluster: nobody. Being listed does nothing without the broker's admin
        token (see admin_token); it does not give any right outside gpusession.""").tag(config=True)
    admin_token = Unicode(help="""The broker's admin token (a hex string, e.g. "3f9c..."), for
        admin operations and to sign the identities of this server's kernels. Default: the
        GPUSESSION_ADMIN_TOKEN environment variable, else empty: read it from the file admin_token
        beside the broker's ledger when that file is on this machine (the embedded cluster, or a
        server on the head node); if there is none, the admin page is read-only and kernels carry
        unsigned identities. Never passed to kernels.""").tag(config=True)
    metrics_public = Bool(False, help="""Whether {base_url}gpusession/metrics (Prometheus text)
        answers without Jupyter authentication, e.g. True so Prometheus can scrape it without a
        token. False (the default): any logged-in Jupyter user may read it. When True anyone who
        reaches the server sees per-user GPU-seconds; it does not rate-limit scrapes.""").tag(config=True)
    run_activity_s = Float(60.0, help="""How often (seconds) this server asks the gpusession gateway
        whether any process under it (a kernel, a terminal's script) follows a live run, e.g. 30.0;
        when one does, the server counts as active at that moment (what jupyterhub-singleuser reports
        to the Hub, so the hub's idle culler leaves it alone). A run counts while it goes on: a
        foreground or background run of a kernel, or a detached run a kernel started or attached to
        and still follows. 60 (the default); `gpusession hub` sets it from its culler's timeout.
        0: off, a live run then counts only through what Jupyter sees itself (requests, terminal
        use, kernel messages such as a live view's updates). Only behind a gateway (`gpusession
        hub`); it never stops or keeps a run going.""").tag(config=True)
    db_path = Unicode("", help="""Path of the broker's SQLite ledger on the head node, e.g.
        "/var/lib/gpusession/ledger.db"; used only when this server starts the embedded head and
        broker (ray_address "local"). Empty: $GPUSESSION_DB_PATH, else the cluster's own directory
        $GPUSESSION_HOME/clusters/HOST/ledger.db (~/.gpusession/...). The admin token and identity key are
        kept beside it. It cannot move the ledger of a broker that already runs.""").tag(config=True)
    default_quota = Dict(help="""Quota of users with no row of their own, e.g.
        {"max_gpus": 2, "gpu_hours": 40, "max_priority": "normal"}: max_gpus = GPUs held at once,
        gpu_hours = GPU-hours per rolling 7 days, max_priority = "low" | "normal" | "high"; a missing
        key or null means no limit (priority: "normal"). Empty (the default): the broker's default or
        the one it remembers. Used only when this server starts the broker (ray_address "local");
        it does not change users who have their own quota row.""").tag(config=True)
    allow_borrowing = Bool(None, allow_none=True, help="""Whether a user may run past max_gpus
        on idle GPUs (such leases are marked over-quota and preempted first), e.g. False on a
        crowded cluster. None (the default): the broker's remembered value, else True. Used only when
        this server starts the broker; it never lets a lease exceed the cluster.""").tag(config=True)
    preemption_grace_s = Float(None, allow_none=True, help="""Seconds a preempted lease gets to
        checkpoint and stop before its GPUs are taken, e.g. 30.0; 0 takes them at once. None (the
        default): the broker's remembered value, else 30. Used only when this server starts the
        broker; it does not extend revocations by an admin.""").tag(config=True)
    require_signed_identity = Bool(None, allow_none=True, help="""Whether the broker refuses
        requests whose user name is not signed by this server (kernels started here carry a
        signature in GPUSESSION_IDENTITY), e.g. False to let scripts outside this server's kernels
        lease GPUs. None (the default): True, since this server starts the broker and signs every
        kernel it starts. Used only when this server starts the broker. It binds
        only code that goes through gpusession: code calling Ray directly is not stopped.""").tag(config=True)

    @default("ray_address")
    def _default_ray_address(self) -> str:
        return os.environ.get("RAY_ADDRESS") or "local"

    @default("admin_token")
    def _default_admin_token(self) -> str:
        return os.environ.get("GPUSESSION_ADMIN_TOKEN", "")

    @default("admin_users")
    def _default_admin_users(self) -> set:
        return {current_user()} if self.ray_address == "local" else set()

    @validate("ray_address")
    def _check_address(self, proposal) -> str:
        value = proposal.value.strip()
        if not ADDRESS.match(value):
            raise TraitError(f'GPUSession.ray_address must be "local", "auto", "host:port" or '
                             f'"ray://host:port"; got {proposal.value!r}.')
        return value

    @validate("local_gpus")
    def _check_local_gpus(self, proposal) -> int:
        if proposal.value < 0:
            raise TraitError(f"GPUSession.local_gpus must be 0 (default: 4) or more; got {proposal.value}.")
        return proposal.value

    @validate("default_quota")
    def _check_default_quota(self, proposal) -> dict:
        try:
            parse_quota_update(proposal.value, Quota(None, None, Priority.NORMAL))
        except ValueError as exc:
            raise TraitError(f"GPUSession.default_quota: {exc}") from None
        return proposal.value

    @validate("run_activity_s")
    def _check_run_activity(self, proposal) -> float:
        value = proposal.value
        if not math.isfinite(value) or value < 0 or 0 < value < 1:
            raise TraitError(f"GPUSession.run_activity_s must be 0 (off) or seconds >= 1; got {value}.")
        return value

    @validate("preemption_grace_s")
    def _check_grace(self, proposal) -> float | None:
        value = proposal.value
        if value is not None and (value < 0 or not math.isfinite(value)):
            raise TraitError(f"GPUSession.preemption_grace_s must be seconds >= 0 or None; got {value}.")
        return value

    @property
    def embedded(self) -> bool:
        return self.ray_address == "local"

    def broker_policy(self) -> dict:
        """The policy this server hands to the broker it starts: only what was configured."""
        values = {name: getattr(self, name) for name in POLICY_TRAITS}
        return {k: v for k, v in values.items() if v not in (None, "", {})}


if __name__ == "__main__":  # `python -m jupyter_ext.config`: every option with its help
    print(GPUSession.class_get_help())
