"""Prometheus metrics of the extender, on a registry owned by the app (no globals).

All names start with ``gpushare_``; counters end in ``_total``; memory is in units of the
node's ``gpuMemoryUnit``, with the unit as a label, because the count is what users ask for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.kube.cache import ClusterCache


class _LedgerCollector(Collector):
    """Reads the cache at scrape time, so the numbers are never stale."""

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self._cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cache = self._cache()
        total = GaugeMetricFamily(
            "gpushare_gpu_memory_units",
            "GPU memory per GPU, in memory units",
            labels=["node", "gpu", "unit"],
        )
        used = GaugeMetricFamily(
            "gpushare_gpu_memory_allocated_units",
            "GPU memory allocated per GPU, in memory units",
            labels=["node", "gpu", "unit"],
        )
        core = GaugeMetricFamily(
            "gpushare_gpu_core_allocated_percent",
            "Computing power allocated per GPU, percent",
            labels=["node", "gpu"],
        )
        pods = GaugeMetricFamily(
            "gpushare_gpu_pods", "Pods holding a share of each GPU", labels=["node", "gpu"]
        )
        synced = GaugeMetricFamily("gpushare_cache_synced", "1 once the cache has listed")
        synced.add_metric([], 1.0 if cache and cache.synced else 0.0)
        if cache is not None:
            for name, node in sorted(cache.nodes.items()):
                usage = cache.ledger.usage(name)
                for gpu in node.gpus:
                    labels = [name, str(gpu.index)]
                    held = usage.on(gpu.index)
                    total.add_metric([*labels, node.unit.value], gpu.mem_units)
                    used.add_metric([*labels, node.unit.value], held.mem_units)
                    core.add_metric(labels, held.core_pct)
                    pods.add_metric(labels, held.pods)
        yield from (total, used, core, pods, synced)


class ExtenderMetrics:
    """Request, bind and ledger metrics."""

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpushare_extender_requests_total",
            "Extender calls by verb and outcome",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_extender_request_duration_seconds",
            "Extender call latency by verb",
            ["verb"],
            registry=self.registry,
        )
        self.binds = Counter(
            "gpushare_bind_total", "Bind attempts by outcome", ["outcome"], registry=self.registry
        )
        self.registry.register(_LedgerCollector(cache))
