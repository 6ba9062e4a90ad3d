"""Prometheus text for {base_url}gpusession/metrics, built from the broker's views at scrape time.

    gpusession_gpus_total 4.0                       capacity (declared GPUs of alive nodes)
    gpusession_gpus_leased 2.0                      held by granted leases
    gpusession_gpus_queued 1.0                      wanted by queued requests
    gpusession_leases_total{outcome="finished"} 12  leases by state or end reason (last LEASE_WINDOW)
    gpusession_gpu_seconds_total{user="alice"} 93.2 since the ledger began
    gpusession_queue_wait_seconds_bucket{le="1.0"}  request-to-grant wait (last LEASE_WINDOW)
"""
from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LEASE_WINDOW = 10_000
WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, float("inf"))
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

    def __init__(self, cluster: dict, leases: list[dict] | None, usage: list[dict] | None) -> None:
        self.cluster, self.leases, self.usage = cluster, leases, usage

    def collect(self):
        for key, text in CLUSTER_GAUGES:
            yield GaugeMetricFamily(f"gpusession_{key}", text, value=float(self.cluster[key]))
        yield GaugeMetricFamily("gpusession_logical_gpus", "1 if the GPUs are logical (no real accelerator)",
                                value=1.0 if self.cluster.get("logical_gpus") else 0.0)
        if self.leases is not None:
            yield self._outcomes()
            yield self._waits()
        if self.usage is not None:
            seconds = CounterMetricFamily("gpusession_gpu_seconds", "GPU-seconds used, by user", labels=["user"])
            for row in self.usage:
                seconds.add_metric([row["user"]], row["gpu_seconds"])
            yield seconds

    def _outcomes(self) -> CounterMetricFamily:
        family = CounterMetricFamily("gpusession_leases", f"Leases by state or end reason (last {LEASE_WINDOW})",
                                     labels=["outcome"])
        counts = Counter(l["end_reason"] if l["state"] == "ended" else l["state"] for l in self.leases)
        for outcome, count in sorted(counts.items()):
            family.add_metric([outcome or "unknown"], count)
        return family

    def _waits(self) -> HistogramMetricFamily:
        waits = [l["granted_at"] - l["requested_at"] for l in self.leases if l.get("granted_at")]
        buckets = [(_label(bound), sum(1 for w in waits if w <= bound)) for bound in WAIT_BUCKETS]
        return HistogramMetricFamily("gpusession_queue_wait_seconds",
                                     f"Seconds from request to grant (last {LEASE_WINDOW} leases)",
                                     buckets=buckets, sum_value=sum(waits))


def _label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def render(cluster: dict, leases: list[dict] | None, usage: list[dict] | None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot(cluster, leases, usage))
    return generate_latest(registry)
