"""Prometheus metrics of the extender, on a registry owned by the app (no globals).

All names start with ``gpushare_``, in base units (bytes, seconds, ratios); counters end in
``_total``. Per-GPU gauges are computed from the ledger when scraped, never updated per event,
so a busy 5000-node cluster pays for them once per scrape, not once per bind.

Every scheduler replica exports the per-GPU gauges, and a query must take each GPU once:
``sum(max by (node, gpu) (gpushare_gpu_memory_bytes))``, never a plain ``sum`` (the chart's
dashboard does so, and tests/integration/chart/test_dashboard.py checks its totals against two
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

DRA mode (``--dra-allocator``, docs/dra.md): the nodes are those gpushare's ResourceSlices publish
and the holdings the claims' allocations, read at scrape time from what the allocator follows
(``inspect.dramode``, the same reading as ``kubectl inspect cgpu``'s), so the per-GPU,
per-node and per-namespace series cover DRA nodes with the same labels. The allocator's
decisions are counted by outcome (``gpushare_dra_allocations_total``), a fixed set of labels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.core.booking.ledger import NodeUsage
from gpushare.core.model.inventory import CORE_PER_GPU, NodeInventory
from gpushare.core.model.pluginserving import plugin_missing
from gpushare.core.records.allocation import Allocation
from gpushare.core.resourcepolicies.resourcepolicy import InvalidResourcePolicy
from gpushare.exporting import ExportRegistry, watch_refused_family
from gpushare.inspect.dramode import DraView
from gpushare.kube.cache import ClusterCache
from gpushare.kube.watchhealth import FAILING_AFTER

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


LEDGER_METRICS = (
    "gpushare_gpu_memory_bytes",
    "gpushare_gpu_memory_allocated_bytes",
    "gpushare_gpu_core_allocated_ratio",
    "gpushare_gpu_pods",
    "gpushare_gpu_unhealthy",
    "gpushare_gpu_out_of_service",
    "gpushare_node_memory_unplaced_bytes",
    "gpushare_node_device_plugin_missing",
    "gpushare_namespace_gpu_memory_allocated_bytes",
    "gpushare_namespace_gpu_core_allocated",
    "gpushare_cache_synced",
    "gpushare_watch_refused",
)
"""Series the scrape-time collector exports (the dashboard test reads this list)."""

DRA_OUTCOMES = ("allocated", "refused", "held", "not_ours")
"""``gpushare_dra_allocations_total``'s outcomes: a claim allocated by gpushare's placement, a
pod no DRA node fits now (gated, or ungated with ``--dra-ungate-refused``; a Warning Event with the
reasons, counted when told), a pod a ResourcePolicy
keeps off every node that fits (kept gated; counted when held and each time its reason changes,
not on every round it waits), a claim left to kube-scheduler's own allocator (another class or
shape)."""

DraSource = Callable[[], DraView | None]
"""What the DRA allocator follows, read as ``kubectl inspect cgpu`` reads it; None until its
watches have listed."""


def _dra_nodes(dra: DraView | None) -> Mapping[str, NodeInventory]:
    return dra.inventories if dra is not None else {}


GPU_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpushare_gpu_memory_bytes", "GPU memory of each shared GPU"),
    (
        "gpushare_gpu_memory_allocated_bytes",
        "GPU memory allocated to pods on each GPU (bookings in flight included)",
    ),
    (
        "gpushare_gpu_core_allocated_ratio",
        "Computing power allocated on each GPU, 0..1 (core_mem nodes)",
    ),
    ("gpushare_gpu_pods", "Pods holding a share of each GPU"),
    (
        "gpushare_gpu_unhealthy",
        "1 when the node's inventory marks the GPU unhealthy (the filter avoids it)",
    ),
    (
        "gpushare_gpu_out_of_service",
        "1 when the node's gpushare.io/gpus-disabled annotation takes the GPU out of service "
        "(its pods stay, the filter places no new one)",
    ),
)
"""The per-GPU gauges (name, help), in the order they are written."""

NODES_PER_TURN = 250
"""Nodes whose per-GPU series are written before the scrape lets the event loop run again."""


def _label_value(value: str) -> str:
    """A label value escaped as the text format asks (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value: a whole number without its ``.0``, any other as Python writes it (both
    forms are what Prometheus's text parser reads)."""
    return str(int(value)) if value.is_integer() else repr(value)


class GpuSeries:
    """The per-GPU gauges, written straight in Prometheus's text format at scrape time.

    They are six series per GPU: 48,000 lines at 1,000 nodes of eight GPUs, 240,000 at 5,000.
    prometheus-client's generic path (a sample object per series, its labels validated and
    escaped one by one) took 1.1 to 2.4 s at 1,000 nodes and 4.4 to 5.6 s at 5,000 on these
    machines, all of it on the event loop that answers kube-scheduler: every scrape stalled
    filter and bind for seconds. Written here, each node's labels are escaped once and its
    numbers read once, and the event loop gets a turn every ``NODES_PER_TURN`` nodes, so a
    filter waits for at most one turn's worth of a scrape.

    Between turns the watch may change the cache: each node is read whole in one turn, and a
    node gone meanwhile is left out, as it would be from a scrape a moment later.
    """

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self._cache = cache
        self.dra: DraSource | None = None
        """DRA mode's nodes and holdings (``ExtenderMetrics.follow_dra``)."""

    async def chunks(self) -> list[bytes]:
        """The six families, HELP and TYPE first, every GPU of every node with GPUs, as pieces
        to send one after the other (joining them would copy 17 MiB at 5,000 nodes in one turn
        of the event loop)."""
        bodies: list[list[bytes]] = [[] for _ in GPU_FAMILIES]
        cache = self._cache()
        if cache is not None:
            dra = self.dra() if self.dra is not None else None
            dra_nodes = _dra_nodes(dra)
            names = [
                name
                for name, node in cache.state.nodes.items()
                if node.gpus and name not in dra_nodes
            ]
            for start in range(0, len(names), NODES_PER_TURN):
                if start:
                    await asyncio.sleep(0)
                nodes, ledger = cache.state.nodes, cache.state.ledger
                turn = self._lines(nodes, ledger.usage, names[start : start + NODES_PER_TURN])
                for body, lines in zip(bodies, turn, strict=True):
                    body.append("".join(lines).encode())
            if dra is not None:
                turn = self._lines(dra_nodes, dra.ledger.usage, sorted(dra_nodes))
                for body, lines in zip(bodies, turn, strict=True):
                    body.append("".join(lines).encode())
        out: list[bytes] = []
        for (name, help_text), body in zip(GPU_FAMILIES, bodies, strict=True):
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode())
            out.extend(body)
        return out

    @staticmethod
    def _lines(
        nodes: Mapping[str, NodeInventory], usage_of: Callable[[str], NodeUsage], names: list[str]
    ) -> list[list[str]]:
        """One turn's lines of each family (a turn's lines are joined and encoded in the same
        turn, so the end of the scrape only copies bytes)."""
        lines: list[list[str]] = [[] for _ in GPU_FAMILIES]
        total, used, core, pods, unhealthy, off = lines
        (n_total, _), (n_used, _), (n_core, _), (n_pods, _), (n_unhealthy, _), (n_off, _) = (
            GPU_FAMILIES
        )
        for name in names:
            node = nodes.get(name)
            if node is None or not node.gpus:
                continue
            usage = usage_of(name)
            unit_bytes = node.unit.mib * MIB
            node_label = _label_value(name)
            for gpu in node.gpus:
                model = _label_value(gpu.model)
                labels = f'{{node="{node_label}",gpu="{gpu.index}",model="{model}"}} '
                held = usage.on(gpu.index)
                total.append(f"{n_total}{labels}{gpu.mem_units * unit_bytes}\n")
                used.append(f"{n_used}{labels}{held.mem_units * unit_bytes}\n")
                core.append(f"{n_core}{labels}{_number(held.core_pct / CORE_PER_GPU)}\n")
                pods.append(f"{n_pods}{labels}{held.pods}\n")
                unhealthy.append(f"{n_unhealthy}{labels}{0 if gpu.healthy else 1}\n")
                off.append(f"{n_off}{labels}{1 if gpu.disabled else 0}\n")
        return lines


class _LedgerCollector(Collector):
    """The ledger's node and namespace totals, read from the cache at scrape time (the
    per-GPU gauges are ``GpuSeries``)."""

    def __init__(self, cache: Callable[[], ClusterCache | None]) -> None:
        self._cache = cache
        self.dra: DraSource | None = None
        """DRA mode's holdings (``ExtenderMetrics.follow_dra``)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cache = self._cache()
        unplaced = GaugeMetricFamily(
            "gpushare_node_memory_unplaced_bytes",
            "GPU memory held on a node by pods whose GPU is unknown (placed by something else)",
            labels=["node"],
        )
        missing = GaugeMetricFamily(
            "gpushare_node_device_plugin_missing",
            "1 for each node labelled ack.node.gpu.schedule with a shared mode where no device "
            "plugin serves GPU memory (reason unpublished: gpushare's plugin never published "
            "the node's GPUs; unregistered: it did, but kubelet offers no GPU memory now); no "
            "series for the other nodes",
            labels=["node", "mode", "reason"],
        )
        by_namespace = _NamespaceTotals()
        synced = GaugeMetricFamily("gpushare_cache_synced", "1 once the cache has listed")
        synced.add_metric([], 1.0 if cache and cache.synced else 0.0)
        if cache is not None:
            ledger = cache.state.ledger
            for name, node in cache.state.nodes.items():
                why = plugin_missing(node)
                if why is not None:
                    missing.add_metric([name, node.mode.value, why.value], 1.0)
                if not node.gpus:
                    continue
                usage = ledger.usage(name)
                if usage.unplaced:
                    unplaced.add_metric([name], usage.unplaced_mem_units * node.unit.mib * MIB)
            dra = self.dra() if self.dra is not None else None
            if dra is None:
                for allocation in ledger.allocations():
                    by_namespace.add(allocation)
            else:
                # the claims as the allocator follows them now, not as its last round booked
                booked = {a.uid for a in ledger.claims()}
                for allocation in ledger.allocations():
                    if allocation.uid not in booked:
                        by_namespace.add(allocation)
                for holding in dra.ledger.holdings:
                    by_namespace.add(holding.allocation)
        yield from (unplaced, missing, *by_namespace.families())
        yield synced
        health = cache.health if cache is not None else None
        yield watch_refused_family(
            "gpushare_watch_refused",
            health.rows() if health is not None else [],
            failing_after=health.failing_after if health is not None else FAILING_AFTER,
        )


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
        book = cache.state.book if cache is not None else None
        for entry in book.entries() if book is not None else ():
            valid = "false" if isinstance(entry, InvalidResourcePolicy) else "true"
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
            "shows the pod), overdue (held 5 s with no bind: its pod waits past PreBind or "
            "Permit, and the intent now gives way), yielded (given back to a pod that fitted "
            "nowhere while it stood: overdue, or younger than that pod); bind's booking "
            "replaces the rest",
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
        self.dra_allocations = Counter(
            "gpushare_dra_allocations_total",
            "DRA mode: gated pods' claims by what the allocator decided: allocated (gpushare's "
            "placement wrote the claim's status), refused (no DRA node fits now; the pod is "
            "told why in a Warning Event), held (a ResourcePolicy keeps the pod off "
            "every node that fits; it stays gated), not_ours (left to kube-scheduler)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in DRA_OUTCOMES:
            self.dra_allocations.labels(outcome)
        self._ledger = _LedgerCollector(cache)
        self.registry.register(self._ledger)
        self.registry.register(_PolicyCollector(cache))
        self.gpus = GpuSeries(cache)

    def follow_dra(self, source: DraSource) -> None:
        """Include DRA mode's nodes and holdings in the ledger series (``--dra-allocator``)."""
        self.gpus.dra = source
        self._ledger.dra = source

    def count_dra(
        self, *, allocated: int = 0, refused: int = 0, held: int = 0, not_ours: int = 0
    ) -> None:
        """Count one allocator round's decisions (``gpushare_dra_allocations_total``)."""
        counts = (allocated, refused, held, not_ours)
        for outcome, count in zip(DRA_OUTCOMES, counts, strict=True):
            if count:
                self.dra_allocations.labels(outcome).inc(count)

    async def exposition(self) -> list[bytes]:
        """What ``/metrics`` serves, in pieces: the registry's series, then the per-GPU gauges."""
        gpus = await self.gpus.chunks()
        return [generate_latest(self.registry), *gpus]
