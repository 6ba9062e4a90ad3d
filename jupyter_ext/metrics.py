"""Prometheus text for {base_url}gpusession/metrics, built from the broker's views at scrape time.

    gpusession_gpus_total 4.0                       capacity (declared GPUs of alive nodes)
    gpusession_gpus_leased 2.0                      held by granted leases
    gpusession_gpus_queued 1.0                      wanted by queued requests
    gpusession_leases_total{outcome="finished"} 12  leases by state or end reason, whole ledger
    gpusession_gpu_seconds_total{user="alice"} 93.2 since the ledger began
    gpusession_queue_wait_seconds_bucket{le="1.0"}  request-to-grant wait, whole ledger

The ledger-wide figures come from the broker's `stats`, which needs the admin token: a server
without it serves only the cluster gauges. The per-user series (gpusession_gpu_seconds_total)
go only to admins (c.GPUSession.admin_users), unless c.GPUSession.metrics_public says that
anyone who may scrape may see them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

WAIT_BOUNDS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)  # seconds; +Inf is the count
CLUSTER_GAUGES = (
    ("gpus_total", "GPUs declared by the cluster's alive nodes"),
    ("gpus_leased", "GPUs held by granted leases"),
    ("gpus_free", "GPUs neither leased nor used outside gpusession"),
    ("gpus_unmanaged", "GPUs in use outside gpusession"),
    ("gpus_queued", "GPUs wanted by queued requests"),
    ("requests_queued", "Requests waiting for GPUs"),
    ("leases_active", "Leases holding GPUs"),
)


class Snapshot:
    """One scrape's data; a prometheus_client collector."""

    def __init__(self, cluster: dict, stats: dict | None, *, per_user: bool) -> None:
        self.cluster, self.stats, self.per_user = cluster, stats, per_user

    def collect(self):
        for key, text in CLUSTER_GAUGES:
            yield GaugeMetricFamily(f"gpusession_{key}", text, value=float(self.cluster[key]))
        yield GaugeMetricFamily("gpusession_logical_gpus", "1 if the GPUs are logical (no real accelerator)",
                                value=1.0 if self.cluster.get("logical_gpus") else 0.0)
        if self.stats is None:
            return
        outcomes = CounterMetricFamily("gpusession_leases", "Leases by state or end reason", labels=["outcome"])
        for outcome, count in sorted(self.stats["outcomes"].items()):
            outcomes.add_metric([outcome], count)
        yield outcomes
        wait = self.stats["queue_wait"]
        buckets = [(_label(bound), count) for bound, count in wait["buckets"]] + [("+Inf", wait["count"])]
        yield HistogramMetricFamily("gpusession_queue_wait_seconds", "Seconds from request to grant",
                                    buckets=buckets, sum_value=wait["sum"])
        if not self.per_user:
            return
        seconds = CounterMetricFamily("gpusession_gpu_seconds", "GPU-seconds used, by user", labels=["user"])
        for user, value in sorted(self.stats["gpu_seconds"].items()):
            seconds.add_metric([user], value)
        yield seconds


def _label(bound: float) -> str:
    return repr(float(bound))


def render(cluster: dict, stats: dict | None, *, per_user: bool = False) -> bytes:
    """Prometheus text; `per_user`: include each user's GPU-seconds (admins, or metrics_public)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot(cluster, stats, per_user=per_user))
    return generate_latest(registry)
