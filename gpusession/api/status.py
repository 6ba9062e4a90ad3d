"""`gs.status()`: the cluster, the caller's quota and usage, and the caller's leases."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..broker.policy.states import LeaseState



@dataclass(frozen=True)
class Status:
    user: str
    cluster: dict
    quota: dict
    leases: list[dict] = field(default_factory=list)

    @property
    def queue_positions(self) -> dict[int, int]:
        return {l["lease_id"]: l["position"] for l in self.leases if l.get("position")}

    def __str__(self) -> str:
        c, q = self.cluster, self.quota
        kind = " (logical: training runs on the CPU)" if c["logical_gpus"] else ""
        limit = "no limit" if q["max_gpus"] is None else f"max {q['max_gpus']:g}"
        budget = "unlimited" if q["gpu_hours"] is None else f"{q['gpu_hours']:g} h"
        lines = [
            f"cluster: {c['gpus_total']:g} GPUs{kind} · {c['gpus_leased']:g} leased · {c['gpus_free']:g} free"
            + (f" · {c['gpus_unmanaged']:g} used outside gpusession" if c["gpus_unmanaged"] else "")
            + (f" · {c['gpus_lost']:g} on lost nodes" if c.get("gpus_lost") else "")
            + f" · {c['requests_queued']} queued",
            f"{self.user}: {q['gpus_in_use']:g} GPUs in use ({limit}) · {q['gpu_hours_7d']:.2f} of {budget} "
            f"GPU-hours in 7 days · max priority {q['max_priority']}",
        ]
        lines[1:1] = [node_line(node) for node in c.get("nodes", []) if "leased" in node]
        for lease in self.leases:
            where = (f"queued, position {lease['position']}: {lease['reason']}" if lease["state"] == LeaseState.QUEUED
                     else f"{lease['state']}, {lease['age_s']:.0f} s")
            step = f", step {lease['step']}" if lease.get("step") is not None else ""
            notebook = f", {lease['notebook']}" if lease.get("notebook") else ""
            background = ", background" if lease.get("background") else ""  # as the sidebar labels it
            lines.append(f"  lease {lease['lease_id']}: {lease['gpus']:g} GPUs, {lease['priority']}, {where}{step}"
                         f"{notebook}{background}")
        return "\n".join(lines)


def node_line(node: dict) -> str:
    """One node as JupyterLab's sidebar shows it: GPUs, in use, free, lent beyond quotas, lost."""
    lost = f" · lost{' (' + node['address'] + ')' if node.get('address') else ''}" if node["lost"] else ""
    return (f"  node {node['node_id'][:8]}: {node['gpus']:g} GPUs · {node['leased']:g} in use · "
            f"{node['free']:g} free · {node['lent']:g} lent{lost}")


def status() -> Status:
    """Cluster capacity, your quota and usage, and your leases with their queue positions."""
    from ..gateway.client import gateway_path

    if gateway_path():  # a hub kernel: the gateway answers as this account, without Ray
        from ..gateway import brokerclient

        data = brokerclient.call("status")
        return Status(user=data["user"], cluster=data["cluster"], quota=data["quota"], leases=data["leases"])
    from ..broker import client  # here, not at the top: the CLI renders a Status without importing Ray
    from ..identity import current_identity

    identity = current_identity()
    data = client.call(client.broker().status, {"user": identity.user, "signature": identity.signature})
    return Status(user=data["user"], cluster=data["cluster"], quota=data["quota"], leases=data["leases"])
