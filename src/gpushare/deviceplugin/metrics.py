"""Prometheus metrics of the device plugin, served on their own port (``--metrics-port``).

The plugin's hot path is kubelet's gRPC, so metrics use prometheus-client's own HTTP server in a
thread. Values are read from the plugin's counters and GPU list when scraped; nothing is
updated per call besides the plain integers the plugin keeps anyway.

Per container (``cgpu`` and ``core_mem`` nodes, where the interposer's broker counts memory):
the GPU memory held now beside the limit, labelled with the pod and container and with the GPU
as dcgm-exporter labels it (``gpu``, the index; ``UUID``), so ``on (UUID)`` joins the two. The
pod's labels are ``pod_namespace``, ``pod_name`` and ``container_name``: Prometheus's
Kubernetes discovery already gives every target ``namespace``, ``pod`` and ``container`` (the
device plugin's own), and a series label of the same name would be renamed ``exported_...``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, make_asgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.core.model.inventory import CORE_PER_GPU
from gpushare.exporting import ExportRegistry, watch_refused_family
from gpushare.kube.metricsguard import MetricsGuard
from gpushare.kube.watchhealth import WatchHealth
from gpushare.node.enforcement.broker import BrokerStats
from gpushare.node.gpus import GpuSource
from gpushare.node.usage import ContainerUse
from gpushare.scraping import GuardCollector, guarded, metrics_only, serve_in_thread
from gpushare.servingcert import ServingCert

MIB = 1024 * 1024
CONTAINER_LABELS = ["node", "pod_namespace", "pod_name", "container_name", "gpu", "UUID"]

DEVICE_PLUGIN_METRICS = (
    "gpushare_device_plugin_allocations_total",
    "gpushare_device_plugin_allocation_failures_total",
    "gpushare_device_plugin_pods_served_total",
    "gpushare_device_plugin_podresources_mismatches_total",
    "gpushare_device_plugin_registrations_total",
    "gpushare_device_plugin_untrusted_allocations_total",
    "gpushare_device_plugin_gpu_memory_bytes",
    "gpushare_device_plugin_gpu_unhealthy",
    "gpushare_device_plugin_broker_connections",
    "gpushare_device_plugin_broker_connections_refused_total",
    "gpushare_device_plugin_broker_idle_closed_total",
    "gpushare_device_plugin_broker_accept_errors_total",
    "gpushare_device_plugin_watch_refused",
    "gpushare_device_plugin_hand_off_check",
    "gpushare_container_gpu_memory_used_bytes",
    "gpushare_container_gpu_memory_limit_bytes",
    "gpushare_container_gpu_core_limit_ratio",
)
"""Series this collector exports (the dashboard test reads this list)."""


class _Stats(Protocol):
    broker: BrokerStats
    allocations: int
    refused: int
    served_pods: int
    mismatches: int
    registrations: int
    untrusted: dict[str, int]
    hand_off: str


class _Plugin(Protocol):
    @property
    def stats(self) -> _Stats: ...

    @property
    def health(self) -> WatchHealth: ...

    @property
    def source(self) -> GpuSource: ...


class DevicePluginCollector(Collector):
    """Reads one plugin's counters and GPUs at scrape time."""

    def __init__(
        self,
        plugin: _Plugin,
        node: str,
        usage: Callable[[], list[ContainerUse]] | None = None,
    ) -> None:
        self._plugin = plugin
        self._node = node
        self._usage = usage or list

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._plugin.stats
        for name, text, value in (
            (
                "gpushare_device_plugin_allocations",
                "Containers Allocate served (one call answers each container)",
                stats.allocations,
            ),
            (
                "gpushare_device_plugin_allocation_failures",
                "Allocate requests refused: no pending pod, or pods that disagree",
                stats.refused,
            ),
            (
                "gpushare_device_plugin_pods_served",
                "Pods confirmed through PodResources and marked ALIYUN_COM_GPU_MEM_ASSIGNED=true",
                stats.served_pods,
            ),
            (
                "gpushare_device_plugin_podresources_mismatches",
                "Containers whose devices per PodResources were served for another placement",
                stats.mismatches,
            ),
            (
                "gpushare_device_plugin_registrations",
                "Registrations with kubelet (one per resource, again after kubelet restarts)",
                stats.registrations,
            ),
            (
                "gpushare_device_plugin_broker_idle_closed",
                "Accounting-broker connections holding no memory closed after the idle timeout",
                stats.broker.idle_closed,
            ),
            (
                "gpushare_device_plugin_broker_accept_errors",
                "Accounting-broker accept() failures for want of descriptors or memory (the "
                "socket pauses a second each time)",
                stats.broker.accept_errors,
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["node"])
            family.add_metric([self._node], value)
            yield family
        untrusted = CounterMetricFamily(
            "gpushare_device_plugin_untrusted_allocations",
            "Pods bound to this node whose gpushare.io/allocation is ignored (not sealed by "
            "gpushare for that pod, or not matching it): never served; each pod once per reason",
            labels=["node", "reason"],
        )
        for reason, value in sorted(stats.untrusted.items()):
            untrusted.add_metric([self._node, reason], value)
        yield untrusted
        refused = CounterMetricFamily(
            "gpushare_device_plugin_broker_connections_refused",
            "Accounting-broker connections answered 'too many connections' and closed, by the "
            "cap they met: container, pod, node, or descriptors (what the plugin's open-file "
            "limit leaves after its own reserve)",
            labels=["node", "cap"],
        )
        for cap, value in sorted(stats.broker.refused.items()):
            refused.add_metric([self._node, cap], value)
        yield refused
        connections = GaugeMetricFamily(
            "gpushare_device_plugin_broker_connections",
            "Accounting-broker connections open now, every container of the node together",
            labels=["node"],
        )
        connections.add_metric([self._node], stats.broker.open)
        yield connections
        hand_off = GaugeMetricFamily(
            "gpushare_device_plugin_hand_off_check",
            "1 for what the start's check found the runtime does with the hand-off: applied, "
            "ignored (started under --hand-off-check warn: pods get no GPU), unknown (the "
            "runtime could not be asked; the log says why) or skipped",
            labels=["node", "verdict"],
        )
        hand_off.add_metric([self._node, stats.hand_off], 1.0)
        yield hand_off
        health = self._plugin.health
        yield watch_refused_family(
            "gpushare_device_plugin_watch_refused",
            health.rows(),
            labels=(("node", self._node),),
            failing_after=health.failing_after,
        )
        memory = GaugeMetricFamily(
            "gpushare_device_plugin_gpu_memory_bytes",
            "Memory of each GPU as the device plugin reads it",
            labels=["node", "gpu", "model"],
        )
        unhealthy = GaugeMetricFamily(
            "gpushare_device_plugin_gpu_unhealthy",
            "1 when the GPU is unhealthy (XID error); its devices are withdrawn from kubelet",
            labels=["node", "gpu", "model"],
        )
        for gpu in self._plugin.source.gpus():
            labels = [self._node, str(gpu.index), gpu.model]
            memory.add_metric(labels, gpu.memory_mib * MIB)
            unhealthy.add_metric(labels, 0.0 if gpu.healthy else 1.0)
        yield memory
        yield unhealthy
        yield from self._containers()

    def _containers(self) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily(
            "gpushare_container_gpu_memory_used_bytes",
            "GPU memory a container's processes hold now, per GPU, as the interposer's broker "
            "counts it (cgpu and core_mem nodes)",
            labels=CONTAINER_LABELS,
        )
        limit = GaugeMetricFamily(
            "gpushare_container_gpu_memory_limit_bytes",
            "GPU memory a container may hold, per GPU (its allocation, as enforced)",
            labels=CONTAINER_LABELS,
        )
        core = GaugeMetricFamily(
            "gpushare_container_gpu_core_limit_ratio",
            "Computing power a container was given on each GPU, 0..1 (only where one was)",
            labels=CONTAINER_LABELS,
        )
        uuids = {gpu.index: gpu.uuid for gpu in self._plugin.source.gpus()}
        for use in self._usage():
            owner = use.owner
            for gpu, held, allowed in zip(
                owner.gpus, use.used_bytes, use.limit_bytes, strict=False
            ):
                labels = [
                    self._node,
                    use.namespace,
                    use.pod_name,
                    owner.container,
                    str(gpu),
                    uuids.get(gpu, ""),
                ]
                used.add_metric(labels, held)
                limit.add_metric(labels, allowed)
                if 0 < owner.core_pct < CORE_PER_GPU:
                    core.add_metric(labels, owner.core_pct / CORE_PER_GPU)
        yield from (used, limit, core)


def registry_for(
    plugin: _Plugin, node: str, usage: Callable[[], list[ContainerUse]] | None = None
) -> ExportRegistry:
    """A registry holding only this plugin's metrics and the build info (no default registry).

    ``usage`` lists each container's GPU memory (``NodeIsolation.usage``); without it the
    per-container series are empty.
    """
    registry = ExportRegistry("device-plugin")
    registry.register(DevicePluginCollector(plugin, node, usage))
    return registry


def serve_metrics(
    registry: CollectorRegistry,
    *,
    port: int,
    host: str = "0.0.0.0",
    guard: MetricsGuard | None = None,
    cert: ServingCert | None = None,
) -> None:
    """Serve ``/metrics`` on a daemon thread; port 0 disables it.

    With ``guard``: over HTTPS (``cert``), to identities allowed ``get /metrics`` only
    (``scraping``), with the guard's own series added to ``registry``. Without: plain HTTP to
    anyone, as before (``--no-metrics-authorization``, for scrapers that cannot send a token).
    """
    if not port:
        return
    if guard is None:
        start_http_server(port, addr=host, registry=registry)
        return
    registry.register(GuardCollector(guard))
    app = guarded(metrics_only(make_asgi_app(registry)), guard)
    serve_in_thread(app, host=host, port=port, cert=cert)
