"""The memory-unit mode: the extender's own scheduler core places the trace, in gpu-mem units.

The paper mode counts milli-GPU so its numbers compare with the published ones; this mode asks
what gpushare itself would do. Every trace node becomes the node JSON the device plugin leaves
(``kube.objects.gpu_node``: each card's memory at the unit, rounded down as the plugin counts
it; mode label from the node, else ``node_mode``), every pod the pod JSON a user would write,
and ``core.decision.scheduling.Scheduler`` filters, scores with the named node policy and reserves
into a
``Ledger``: the code the extender runs, decisions and messages included.

The mapping of a share, as a user writes it: one fixed integer ``aliyun.com/gpu-mem`` per pod,
whatever card it lands on. A share of ``gpu_milli`` asks for that fraction of the *typical* card
it may use, rounded up to whole units: the card size most of the GPUs it may use have (the
models its ``gpu_spec`` allows, else every model of the cluster), as a user sizes a job on the
cluster's common card. On the openb nodes that is the 19 GiB G2 for a pod that names no model:
470 milli asks 9 GiB on a G2 and on a T4 alike, and a whole GPU asks 19 GiB, which no 14 or
15 GiB card can give (such a pod needs a card at least as large as the one it was sized on). A
whole GPU is all of the typical card; k GPUs ask k times it with the label
``aliyun.com/gpu-count: k``. On ``core_mem`` nodes the pod also asks the same percentage of
computing power, rounded up to a multiple of 5 (470 -> 50 %). ``as_written`` turns a stream
into these manifests' amounts once, so every policy, the simulator and the real-cluster replay
see the same pods; a pod read from a manifest asks for exactly the memory (and computing
power) written there. (Sizing on the smallest card instead, so that every pod fits every card,
asks about a quarter less than the paper's shares: the stream then needs a third more pods to
reach the same memory, host memory runs out first, and about 26 % of GPU memory stays
unallocated under every policy, which says nothing about GPU placement.)

gpu-mem says nothing of CPU and memory, which the extender leaves to kube-scheduler, so the
simulator checks the trace's CPU, memory and GPU model per node before the core filter (numpy
over all nodes), and keeps a mirror of free units per GPU to skip nodes that cannot fit. Both
only narrow the nodes the core is asked about; the core decides. CPU-only pods never reach
the extender: they take the first node with room in the seeded node order.

Ties between equal scores go to the earliest node in the same seeded order as the paper mode.
Scores are the policy's float before the extender rounds them to 0..10.

Accounting in the protocol's terms: unallocated % = 100 - booked units / all units of the
cluster (booked amounts include the rounding up to whole units, a real cost of the memory
contract). Arrived % = requested units / all units, requested as written (failed pods
included), the same for every policy.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.gpumodel import LABEL_MODEL
from gpushare.core.model.inventory import CORE_PER_GPU, Mode, NodeInventory, read_node
from gpushare.core.model.names import ANN_NODE_TOPOLOGY
from gpushare.core.model.requests import CORE_STEP, PodRequest
from gpushare.core.model.topology import Distance, topology_annotation
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation
from gpushare.core.records.trust import Trust
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import KubeDict
from gpushare.sim import cards
from gpushare.sim.kubeyaml import card_units
from gpushare.sim.links import Connected, node_layouts
from gpushare.sim.milligpu import Run
from gpushare.sim.openb import MILLI_PER_GPU, TraceError, TraceNode, TracePod
from gpushare.sim.stream import arrival_stream

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class MemorySettings:
    """How the trace is turned into gpushare nodes and pods."""

    unit: MemoryUnit = MemoryUnit.GiB
    """The cluster's gpu-mem unit (``--gpu-memory-unit``)."""
    node_mode: Mode = Mode.SHARE
    """``ack.node.gpu.schedule`` for nodes that carry no mode of their own."""
    max_pods_per_gpu: int | None = None
    """The isolation limit on cgpu/core_mem nodes; None: the extender's default."""
    topology: str = ""
    """A layout of ``core.model.topology.LAYOUTS`` the nodes have (``sim.links``); '': none."""
    topology_aware: bool = True
    """Publish that topology on the nodes, so the core follows it; False: the same nodes
    placed as if they published none (the measure of what following it costs)."""
    allocation_mode: str = "device-plugin"
    """``device-plugin``: pods bound with gpushare's allocation record (``MemoryCluster``);
    ``dra``: every node published as its DRA driver's ResourceSlice and every GPU pod allocated
    as a ResourceClaim by gpushare's DRA allocator, its share counted as the DRA ledger reads
    the claim's status back (``sim.draplacing.DraCluster``)."""

    def mode_label(self, node: TraceNode) -> str:
        """The node's ``ack.node.gpu.schedule`` as written: its own label, else ``node_mode``."""
        return node.mode or self.node_mode.value


def policies() -> list[str]:
    """The extender's node policies, by name (whatever its scheduler's registry holds)."""
    registry = Scheduler().registry
    return registry.names() if registry is not None else []


def check(nodes: Sequence[TraceNode], unit: MemoryUnit) -> None:
    """Refuse nodes whose card size is unknown, rather than counting their GPUs as empty."""
    for node in nodes:
        if node.gpus and not card_units(node, unit):
            raise TraceError(
                f"node {node.name}: model={node.model!r} is not in the per-model memory table "
                f"({cards.known_models()}); the memory mode needs each card's size: describe "
                f"the node in Kubernetes YAML with aliyun.com/gpu-mem or nvidia.com/gpu.memory"
            )


def share_units(milli: int, units: int) -> int:
    """``milli`` thousandths of a card of ``units`` units, rounded up to whole units."""
    return -(-milli * units // MILLI_PER_GPU)


def core_percent(milli: int) -> int:
    """The same share of computing power, rounded up to the contract's multiple of 5."""
    return min(CORE_PER_GPU, max(CORE_STEP, -(-milli // (10 * CORE_STEP)) * CORE_STEP))


def pod_units(pod: TracePod, units: int, unit: MemoryUnit) -> int:
    """Units the pod asks for on each of its GPUs, on a card of ``units`` units."""
    if pod.gpu_mem_mib:
        return -(-pod.gpu_mem_mib // unit.mib)
    return share_units(pod.gpu_milli, units)


def typical_card(pod: TracePod, nodes: Sequence[TraceNode], unit: MemoryUnit) -> int:
    """Units of the card most GPUs the pod may use have (its models, else any); 0 if none.

    Among equally common sizes the smaller counts.
    """
    counts: dict[int, int] = {}
    for node in nodes:
        if node.gpus and (not pod.gpu_spec or node.model in pod.gpu_spec):
            size = card_units(node, unit)
            if size > 0:
                counts[size] = counts.get(size, 0) + node.gpus
    return min(counts, key=lambda size: (-counts[size], size)) if counts else 0


class Sizing:
    """Turns a share into the memory a user writes, remembering each ``gpu_spec``'s typical card."""

    def __init__(self, nodes: Sequence[TraceNode], unit: MemoryUnit) -> None:
        self.nodes = nodes
        self.unit = unit
        self._cards: dict[tuple[str, ...], int] = {}

    def written(self, pod: TracePod) -> TracePod:
        """The pod with the fixed gpu-mem a user would write (see the module docstring).

        A pod that already asks in memory, or for no GPU, is kept as it is; a share that no
        card of the cluster may take keeps asking for the share and fails as the paper mode's.
        """
        if pod.gpu_mem_mib or not pod.num_gpu:
            return pod
        card = self._cards.get(pod.gpu_spec)
        if card is None:
            card = self._cards[pod.gpu_spec] = typical_card(pod, self.nodes, self.unit)
        if not card:
            return pod
        return dataclasses.replace(
            pod, gpu_mem_mib=share_units(pod.gpu_milli, card) * self.unit.mib
        )


def as_written(
    pods: Sequence[TracePod], nodes: Sequence[TraceNode], unit: MemoryUnit
) -> list[TracePod]:
    """The pods with the fixed gpu-mem a user would write (``Sizing.written``)."""
    sizing = Sizing(nodes, unit)
    return [sizing.written(pod) for pod in pods]


def pod_core(pod: TracePod, core_mem: bool) -> int:
    """Percent per GPU: what the manifest wrote, else the share's percentage on core_mem."""
    if pod.gpu_core_pct:
        return pod.gpu_core_pct
    return core_percent(pod.gpu_milli) if core_mem else 0


def node_json(node: TraceNode, settings: MemorySettings, distance: Distance = ()) -> KubeDict:
    """The node as gpushare's device plugin would leave it, with the trace's CPU and memory
    (and ``distance`` as its published topology, when the settings follow one)."""
    units = card_units(node, settings.unit)
    obj = gpu_node(
        node.name,
        gpus_units=[units] * node.gpus,
        mode=settings.mode_label(node),
        unit=settings.unit,
        model=node.model,
    )
    for part in ("capacity", "allocatable"):
        obj["status"][part].update(cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi")
    obj["metadata"]["labels"][LABEL_MODEL] = node.model
    if distance and settings.topology_aware:
        obj["metadata"]["annotations"][ANN_NODE_TOPOLOGY] = topology_annotation(distance)
    return obj


def pod_json(
    pod: TracePod, *, uid: str, units_per_gpu: int, core_per_gpu: int, unit: MemoryUnit
) -> KubeDict:
    """The pod a user would write for this share: gpu-mem, computing power, CPU and memory."""
    count = max(1, pod.num_gpu)
    obj = gpu_pod(
        f"{pod.name}-{uid}",
        mem=units_per_gpu * count if pod.num_gpu else None,
        core=core_per_gpu * count if core_per_gpu else None,
        gpu_count=str(count) if count > 1 else None,
    )
    obj["metadata"]["uid"] = uid
    obj["spec"]["containers"][0]["resources"]["requests"] = {
        "cpu": f"{pod.cpu_milli}m",
        "memory": f"{pod.memory_mib}Mi",
    }
    if pod.gpu_spec:  # the trace's allowed models, as required affinity on the model label
        term = {"key": LABEL_MODEL, "operator": "In", "values": sorted(pod.gpu_spec)}
        obj["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    return obj


def node_ranks(count: int, seed: int) -> list[int]:
    """Each node's place in the seed's tie order (0 first), by its index in the node list.

    The simulator gives equal scores to the earliest node in this order; the real-cluster
    replay (``benchmarks/replay.py``) names its nodes so that name order is this order, because
    the extender breaks ties by the first name (``core.placement.ranking.single_top``).
    """
    order = list(range(count))
    random.Random(seed).shuffle(order)
    ranks = [0] * count
    for place, index in enumerate(order):
        ranks[index] = place
    return ranks


class MemoryCluster:
    """The trace's nodes as inventories, a ledger, and the CPU/memory the core does not see."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        *,
        policy: str = "binpack",
        seed: int = 0,
        settings: MemorySettings | None = None,
    ) -> None:
        self.settings = settings or MemorySettings()
        unit = self.settings.unit
        check(nodes, unit)
        self.nodes = list(nodes)
        self.scheduler = Scheduler(
            Settings(unit=unit, max_pods_per_gpu=self.settings.max_pods_per_gpu, policy=policy)
        )
        self.distance = node_layouts(self.nodes, self.settings.topology)
        self.connected = Connected()
        self.inventories: list[NodeInventory] = [
            read_node(node_json(n, self.settings, d), cluster_unit=unit)
            for n, d in zip(self.nodes, self.distance, strict=True)
        ]
        # the state the extender's cache keeps, every node in it, rebuilt as one list gives it
        self.state = ClusterState.listed(
            settings=self.scheduler.settings, trust=Trust(), nodes=self.inventories
        )
        self.ledger = self.state.ledger
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.units: IntArray = np.array([card_units(n, unit) for n in self.nodes], dtype=np.int64)
        self.core_mem: BoolArray = np.array(
            [inv.mode is Mode.CORE_MEM for inv in self.inventories], dtype=np.bool_
        )
        self.cpu: IntArray = np.array([n.cpu_milli for n in self.nodes], dtype=np.int64)
        self.mem: IntArray = np.array([n.memory_mib for n in self.nodes], dtype=np.int64)
        width = max((n.gpus for n in self.nodes), default=1) or 1
        self.free: IntArray = np.full((len(self.nodes), width), -1, dtype=np.int64)
        for i, node in enumerate(self.nodes):
            self.free[i, : node.gpus] = self.units[i]
        self.capacity = int(sum(self.units[i] * n.gpus for i, n in enumerate(self.nodes)))
        self.rank: IntArray = np.array(node_ranks(len(self.nodes), seed), dtype=np.int64)
        self._models: dict[tuple[str, ...], BoolArray] = {}
        self._sizing = Sizing(self.nodes, unit)

    def model_mask(self, spec: tuple[str, ...]) -> BoolArray:
        """Nodes whose model the pod allows (all when it names none)."""
        mask = self._models.get(spec)
        if mask is None:
            mask = np.array([not spec or n.model in spec for n in self.nodes], dtype=np.bool_)
            self._models[spec] = mask
        return mask

    def need(self, pod: TracePod) -> int:
        """Units per GPU the pod asks for, as written (``as_written``); 0 if no card may take it."""
        written = self._sizing.written(pod)
        return pod_units(written, 0, self.settings.unit) if written.gpu_mem_mib else 0

    def requested(self, pod: TracePod) -> float:
        """The pod's request in units, for arrived % (see the module docstring)."""
        return float(self.need(pod) * pod.num_gpu)

    def place(self, pod: TracePod, uid: str) -> tuple[int, str]:
        """Place one pod: (units booked, failure reason or "")."""
        model = self.model_mask(pod.gpu_spec)
        cpu = self.cpu >= pod.cpu_milli
        mem = self.mem >= pod.memory_mib
        room = cpu & mem
        if not pod.num_gpu:
            candidates = np.flatnonzero(model & room)
            if not len(candidates):
                return 0, self._failure(pod, model, np.ones_like(model), cpu, mem)
            self._take(int(candidates[np.argmin(self.rank[candidates])]), pod, None, uid)
            return 0, ""
        need = self.need(pod)
        gpus = ((self.free >= need).sum(axis=1) >= pod.num_gpu) & (need > 0)
        candidates = np.flatnonzero(model & room & gpus)
        objs = {
            core_mem: pod_json(
                pod,
                uid=uid,
                units_per_gpu=need,
                core_per_gpu=pod_core(pod, core_mem),
                unit=self.settings.unit,
            )
            for core_mem in (False, True)
        }
        # The extender's cache counts every pod it watches, also one that kube-scheduler's own
        # filters (CPU, memory, models) refuse before the extender is asked: count it here too,
        # or the learned workload refreshes one pod later than the real cluster's.
        if self.scheduler.workload is not None:
            self.scheduler.workload.observe(objs[False])
        best: tuple[float, int, PodRequest] | None = None
        reasons: list[str] = []
        for core_mem in (False, True):
            group = candidates[self.core_mem[candidates] == core_mem]
            if not len(group):
                continue
            nodes = [self.inventories[int(i)] for i in group]
            result = self.scheduler.filter(
                objs[core_mem], nodes, self.ledger, cluster=self.state.nodes
            )
            request = result.request
            if not isinstance(request, PodRequest):
                reasons += request.reasons
                continue
            for i, inv, verdict in zip(group, nodes, result.verdicts, strict=True):
                if not verdict.fits:
                    reasons += verdict.reasons
                    continue
                score = self.scheduler.score(
                    request, inv, self.ledger, verdict=verdict, cluster=self.state.nodes
                )
                key = (score, -int(self.rank[i]))
                if best is None or key > (best[0], -int(self.rank[best[1]])):
                    best = (score, int(i), request)
        if best is None:
            reason = self._failure(pod, model, gpus, cpu, mem) if not len(candidates) else ""
            return 0, reason or _core_reason(reasons)
        _, i, request = best
        reserved = self.scheduler.reserve(
            request, self.inventories[i], self.ledger, cluster=self.state.nodes
        )
        booked = reserved.allocation
        if booked is None:
            raise AssertionError(
                f"the core refused a node it had just passed: {reserved.status.message}"
            )
        self._take(i, pod, booked, uid)
        self.connected.record([share.index for share in booked.gpus], self.distance[i])
        return booked.mem_units, ""

    def _take(self, i: int, pod: TracePod, allocation: Allocation | None, uid: str) -> None:
        if allocation is None:  # the core counts the CPU a CPU-only pod takes, as its cache would
            bound = pod_json(pod, uid=uid, units_per_gpu=0, core_per_gpu=0, unit=self.settings.unit)
            bound["spec"]["nodeName"] = self.nodes[i].name
            self.state.apply_pod("ADDED", bound)  # as the watch shows it bound
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        for share in allocation.gpus if allocation else ():
            self.free[i, share.index] -= share.mem_units

    @staticmethod
    def _failure(
        pod: TracePod, model: BoolArray, gpus: BoolArray, cpu: BoolArray, mem: BoolArray
    ) -> str:
        """The first requirement, in the paper mode's order, that leaves no node."""
        whole = pod.num_gpu > 1 or pod.gpu_milli == MILLI_PER_GPU
        checks = [
            ("GPU model", model),
            (f"{pod.num_gpu} whole GPU(s)" if whole else "GPU share", gpus),
            ("CPU", cpu),
            ("host memory", mem),
        ]
        mask = np.ones_like(model)
        for name, check in checks:
            mask &= check
            if not mask.any():
                return name
        return "combination"


def _core_reason(reasons: Sequence[str]) -> str:
    """Name what the core refused with, by kind (computing power, isolation limit, mode)."""
    text = " ".join(reasons)
    for needle, name in (
        ("node mode is", "node mode"),
        ("takes only pods", "node mode"),
        ("not shared", "node mode"),
        ("computing power free", "computing power"),
        ("isolation limit", "isolation pod limit"),
        ("unhealthy", "unhealthy GPU"),
    ):
        if needle in text:
            return name
    return "core filter"


def stream(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    *,
    seed: int,
    tune: float = 1.3,
    unit: MemoryUnit = MemoryUnit.GiB,
) -> list[TracePod]:
    """The paper's arrival stream in this mode: pods as written, inflated to ``tune`` x memory.

    The shuffle and the clone draws are the paper mode's for the seed; the inflation stops at
    ``tune`` x all units of the cluster, counted as the pods ask (``as_written``), so 100 %
    arrived means as much memory asked as the cluster has.
    """
    written = as_written(pods, nodes, unit)
    capacity = sum(card_units(n, unit) * n.gpus for n in nodes)

    def units(pod: TracePod) -> float:
        return float(pod_units(pod, 0, unit) * pod.num_gpu) if pod.gpu_mem_mib else 0.0

    return arrival_stream(written, nodes, seed=seed, tune=tune, weight=units, capacity=capacity)


ClusterKind = Callable[..., "MemoryCluster"]
"""Makes the cluster a replay places into: ``MemoryCluster`` or a mode's subclass
(``sim.draplacing.DraCluster``), called as ``MemoryCluster`` is."""


def replay(
    nodes: Sequence[TraceNode],
    stream: Sequence[TracePod],
    policy: str,
    *,
    seed: int = 0,
    settings: MemorySettings | None = None,
    kind: ClusterKind | None = None,
) -> Run:
    """Place every pod of the stream once, in order, with the extender's core (in ``kind``'s
    cluster: the device plugin's by default)."""
    make = kind or MemoryCluster
    cluster = make(nodes, policy=policy, seed=seed, settings=settings)
    run = Run(policy=policy)
    requested = 0.0
    allocated = 0
    capacity = max(1, cluster.capacity)
    for step, pod in enumerate(stream):
        requested += cluster.requested(pod)
        booked, reason = cluster.place(pod, str(step))
        allocated += booked
        if reason:
            run.failed[reason] = run.failed.get(reason, 0) + 1
        run.arrived.append(100.0 * requested / capacity)
        run.unallocated.append(100.0 - 100.0 * allocated / capacity)
    run.connected = cluster.connected.counts
    return run
