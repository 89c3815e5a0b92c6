"""Prometheus metrics of the extender, on a registry owned by the app (no globals).

All names start with ``gpushare_``, in base units (bytes, seconds, ratios); counters end in
``_total``. Per-GPU gauges are computed from the ledger when scraped, never updated per event,
so a busy 5000-node cluster pays for them once per scrape, not once per bind.

Every scheduler replica exports the per-GPU gauges, and a query must take each GPU once:
``sum(max by (node, gpu) (gpushare_gpu_memory_bytes))``, never a plain ``sum`` (the chart's
dashboard does so, and tests/integration/test_dashboard.py checks its totals against two
replicas). Exporting them from the leader alone was the other way, and is not taken because:

- the extender does not know who leads. kube-scheduler beside it holds the Lease and tells
  nothing; reading the Lease would cost every replica a watch and a Role, and still be wrong
  for a while at hand-overs (after a crash nobody leads until the Lease expires, 15 s by
  default), showing no GPUs or, with a stale reading, all of them twice;
- the standby's cache watches the same API server and holds the same bound pods, so both
  replicas report the same numbers. They differ only while a bind is in flight, where the
  replica that binds counts its booking a moment before the other sees the annotations:
  ``max`` picks the leader's view then, and either view when one replica is down or restarting.

Counters need nothing of the kind: only the leading kube-scheduler calls its extender, so a
``sum`` of rates over replicas counts each call once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.core.booking.ledger import GpuUsage
from gpushare.core.model.inventory import CORE_PER_GPU, Gpu
from gpushare.core.records.allocation import Allocation
from gpushare.core.resourcepolicies.resourcepolicy import PolicyError
from gpushare.exporting import ExportRegistry
from gpushare.kube.cache import ClusterCache

MIB = 1024 * 1024

CALL_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds: filter and prioritize take about a millisecond, bind two API round trips, and
kube-scheduler gives up after 5 s (``httpTimeout``)."""

GPU_LABELS = ["node", "gpu", "model"]

LEDGER_METRICS = (
    "gpushare_gpu_memory_bytes",
    "gpushare_gpu_memory_allocated_bytes",
    "gpushare_gpu_core_allocated_ratio",
    "gpushare_gpu_pods",
    "gpushare_gpu_unhealthy",
    "gpushare_gpu_out_of_service",
    "gpushare_node_memory_unplaced_bytes",
    "gpushare_namespace_gpu_memory_allocated_bytes",
    "gpushare_namespace_gpu_core_allocated",
    "gpushare_cache_synced",
)
"""Series the scrape-time collector exports (the dashboard test reads this list)."""


class _LedgerCollector(Collector):
    """Reads the cache at scrape time, so the numbers are never stale."""

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self._cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One family at a time: the scrape formats each before the next is built.

        At 5,000 nodes of 8 GPUs each per-GPU family is 40,000 samples (a labels dict each);
        built all at once the six came to about 100 MiB for the length of a scrape.
        """
        cache = self._cache()
        gpus: list[tuple[list[str], Gpu, GpuUsage, int]] = []
        """Each GPU's labels, inventory, what is held on it and its unit in bytes."""
        unplaced = GaugeMetricFamily(
            "gpushare_node_memory_unplaced_bytes",
            "GPU memory held on a node by pods whose GPU is unknown (placed by something else)",
            labels=["node"],
        )
        by_namespace = _NamespaceTotals()
        if cache is not None:
            ledger = cache.ledger
            for name, node in cache.nodes.items():
                if not node.gpus:
                    continue
                usage = ledger.usage(name)
                unit_bytes = node.unit.mib * MIB
                for gpu in node.gpus:
                    gpus.append(
                        ([name, str(gpu.index), gpu.model], gpu, usage.on(gpu.index), unit_bytes)
                    )
                if usage.unplaced:
                    unplaced.add_metric([name], usage.unplaced_mem_units * unit_bytes)
            for allocation in ledger.allocations():
                by_namespace.add(allocation)
        for name, help_text, value in _PER_GPU:
            family = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
            for labels, gpu, held, unit_bytes in gpus:
                family.add_metric(labels, value(gpu, held, unit_bytes))
            yield family
        yield from (unplaced, *by_namespace.families())
        synced = GaugeMetricFamily("gpushare_cache_synced", "1 once the cache has listed")
        synced.add_metric([], 1.0 if cache and cache.synced else 0.0)
        yield synced


_PER_GPU: tuple[tuple[str, str, Callable[[Gpu, GpuUsage, int], float]], ...] = (
    (
        "gpushare_gpu_memory_bytes",
        "GPU memory of each shared GPU",
        lambda gpu, _, unit_bytes: gpu.mem_units * unit_bytes,
    ),
    (
        "gpushare_gpu_memory_allocated_bytes",
        "GPU memory allocated to pods on each GPU (bookings in flight included)",
        lambda _, held, unit_bytes: held.mem_units * unit_bytes,
    ),
    (
        "gpushare_gpu_core_allocated_ratio",
        "Computing power allocated on each GPU, 0..1 (core_mem nodes)",
        lambda _, held, __: held.core_pct / CORE_PER_GPU,
    ),
    ("gpushare_gpu_pods", "Pods holding a share of each GPU", lambda _, held, __: held.pods),
    (
        "gpushare_gpu_unhealthy",
        "1 when the node's inventory marks the GPU unhealthy (the filter avoids it)",
        lambda gpu, _, __: 0.0 if gpu.healthy else 1.0,
    ),
    (
        "gpushare_gpu_out_of_service",
        "1 when the node's gpushare.io/gpus-disabled annotation takes the GPU out of service "
        "(its pods stay, the filter places no new one)",
        lambda gpu, _, __: 1.0 if gpu.disabled else 0.0,
    ),
)
"""The per-GPU families, in the order they are exported: name, help, value of one GPU."""


class _NamespaceTotals:
    """Memory and computing power held per pod namespace: chargeback's view of the ledger.

    The label is ``pod_namespace``, not ``namespace``: Prometheus's Kubernetes discovery gives
    every target a ``namespace`` label (the scraped gpushare pod's), which would rename this one
    ``exported_namespace``. Bookings in flight count, as in the per-GPU gauges.
    """

    def __init__(self) -> None:
        self.mem: dict[str, float] = {}
        self.core: dict[str, float] = {}

    def add(self, allocation: Allocation) -> None:
        ns = allocation.namespace
        mem = allocation.mem_units * allocation.unit.mib * MIB
        self.mem[ns] = self.mem.get(ns, 0.0) + mem
        self.core[ns] = self.core.get(ns, 0.0) + allocation.core_pct / CORE_PER_GPU

    def families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        mem = GaugeMetricFamily(
            "gpushare_namespace_gpu_memory_allocated_bytes",
            "GPU memory allocated to the pods of each namespace (bookings in flight included)",
            labels=["pod_namespace"],
        )
        core = GaugeMetricFamily(
            "gpushare_namespace_gpu_core_allocated",
            "Computing power allocated to the pods of each namespace, in GPUs (1 = a whole "
            "GPU's; gpu-core.percentage pods on core_mem nodes)",
            labels=["pod_namespace"],
        )
        for ns in sorted(self.mem):
            mem.add_metric([ns], self.mem[ns])
            core.add_metric([ns], self.core[ns])
        return mem, core


class _PolicyCollector(Collector):
    """The ResourcePolicies the extender applies, by the generation it read (at scrape time).

    ``metadata.generation`` rises with each change to a policy's spec, so comparing this
    series with the object says whether the extender has taken a change in yet.
    """

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self._cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpushare_resource_policy_generation",
            "metadata.generation of each ResourcePolicy as the extender last read it; valid is "
            "false when gpushare cannot apply it (its pods are refused with the reason)",
            # not "namespace": the target label of the scraped pod's namespace (see
            # docs/observability.md, labels)
            labels=["policy_namespace", "name", "valid"],
        )
        cache = self._cache()
        book = cache.book if cache is not None else None
        for entry in book.entries() if book is not None else ():
            valid = "false" if isinstance(entry, PolicyError) else "true"
            family.add_metric([entry.namespace, entry.name, valid], entry.generation)
        yield family


class ExtenderMetrics:
    """Request, bind and ledger metrics."""

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self.registry = ExportRegistry("extender")
        self.requests = Counter(
            "gpushare_extender_requests_total",
            "Extender calls by verb and outcome",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_extender_request_duration_seconds",
            "Extender call latency by verb (filter, prioritize, bind)",
            ["verb"],
            buckets=CALL_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.binds = Counter(
            "gpushare_bind_total",
            "Bind attempts by outcome (bound, already_bound, conflict, unfit, rejected, error)",
            ["outcome"],
            registry=self.registry,
        )
        self.intents = Counter(
            "gpushare_intents_total",
            "Intents (GPUs booked at filter or prioritize for the top node until the bind comes) "
            "by what happened: booked, expired (no bind before the deadline), dropped (the pod "
            "was tried again or its bind failed), withheld (not booked: a pod of the namespace "
            "whose intent expired is still pending), unseen (booked for 3 s, kept once the watch "
            "shows the pod); bind's booking replaces the rest",
            ["outcome"],
            registry=self.registry,
        )
        self.retries = Counter(
            "gpushare_retries_total",
            "Pods refused for want of GPU that the extender asked kube-scheduler to try again "
            "once GPUs came back (an intent given back), by outcome: touched, gone, error",
            ["outcome"],
            registry=self.registry,
        )
        self.filter_answers = Counter(
            "gpushare_filter_answers_total",
            "Filter answers that let a GPU pod through, by how: top_node (only the extender's "
            "top node, so kube-scheduler skips scoring and prioritize; also the only fitting "
            "node) or, with every fitting node, why not: other_profile, stated_preference, "
            "placed_affinity, prefer_no_schedule_taint, no_score",
            ["answer"],
            registry=self.registry,
        )
        self.deferrals = Counter(
            "gpushare_handoff_deferrals_total",
            "Nodes that deferred a pod in filter to keep the device plugin's hand-off "
            "unambiguous (it fits once the pod it collides with has started)",
            registry=self.registry,
        )
        self.untrusted = Counter(
            "gpushare_untrusted_allocations_total",
            "Pods whose gpushare.io/allocation annotation the ledger ignores (not sealed by "
            "gpushare for that pod, bound elsewhere, or not matching the pod's requests), each "
            "pod counted once per reason",
            ["reason"],
            registry=self.registry,
        )
        self.events = Counter(
            "gpushare_events_total",
            "Pod events queued by reason",
            ["reason"],
            registry=self.registry,
        )
        self.events_skipped = Counter(
            "gpushare_events_skipped_total",
            "Normal events not written by reason, past the cap of --normal-events-per-second",
            ["reason"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "gpushare_watch_skipped_total",
            "Nodes and pods the cache did not take in, by kind and reason: shape (a field gpushare "
            "reads has a type Kubernetes never writes) or error (a reader failed on it); the "
            "object's last good version stays",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.registry.register(_LedgerCollector(cache))
        self.registry.register(_PolicyCollector(cache))
