"""The paper's milli-GPU accounting, exactly, so gpushare's numbers compare with published ones.

Each GPU has 1000 milli-GPU. A fractional pod needs one GPU with at least its ``gpu_milli`` free;
a k-GPU pod needs k completely free GPUs; CPU and memory must fit; ``gpu_spec`` restricts models.
Pods arrive once each and are never retried. Unallocated % = 100 - allocated / capacity.

Ties between equally scored nodes go to the earliest node in a random order fixed per seed. The
FGD artifact does the same: it prefixes node names with a seeded random permutation and its
kube-scheduler fork keeps the lexicographically smallest name among the best scores. Breaking
each tie afresh at random instead spreads pods over the whole cluster and costs FGD about five
points (10.2 % instead of 4.9 % unallocated at 100 % arrived on seed 0).

With a topology (``sim.links``) and ``aware``, a pod over several GPUs takes the best-connected
set of free ones (``core.model.topology.closest_set``, ties to the lowest indexes) instead of the
lowest indexes. Here every multi-GPU pod takes whole GPUs, which are interchangeable for every
later pod and every policy's score (they read a node's free shares as a multiset), so the
choice costs nothing in packing in this mode; the memory mode (``sim.gpumem``), where a GPU
is shared by memory, is where it can.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gpushare.core.model.topology import closest_set
from gpushare.core.placement.defragmenting import (
    FGD,
    GPUSHARE,
    Defragmenter,
    Variant,
    learned_workload,
)
from gpushare.core.placement.fragmentation import Shape, WorkloadEstimate, fragmentation
from gpushare.core.placement.scarcity import Prices
from gpushare.sim.links import Connected, node_layouts
from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod
from gpushare.sim.stream import capacity_milli

CPU_NORM = 128_000
GPU_NORM = 8_000

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def shape_of(pod: TracePod) -> Shape:
    """The pod as a target-workload shape (milli-CPU, milli-GPU per GPU, GPUs, models)."""
    return Shape(pod.cpu_milli, pod.gpu_milli, pod.num_gpu, pod.gpu_spec)


class Cluster:
    """Free CPU, memory and per-GPU share of every node, as arrays."""

    def __init__(
        self, nodes: Sequence[TraceNode], *, seed: int = 0, topology: str = "", aware: bool = False
    ) -> None:
        self.nodes = list(nodes)
        self.distance = node_layouts(self.nodes, topology)
        """Each node's GPU topology (``sim.links``); () for none."""
        self.aware = aware
        """Multi-GPU pods take the best-connected free GPUs, not the lowest indexes."""
        count = len(self.nodes)
        width = max((n.gpus for n in self.nodes), default=0)
        self.cpu: IntArray = np.array([n.cpu_milli for n in self.nodes], dtype=np.int64)
        self.mem: IntArray = np.array([n.memory_mib for n in self.nodes], dtype=np.int64)
        self.gpus: IntArray = np.array([n.gpus for n in self.nodes], dtype=np.int64)
        self.built: FloatArray = np.array(
            [n.cpu_milli / max(1, n.gpus) for n in self.nodes], dtype=np.float64
        )
        """Each node's own milli-CPU per GPU."""
        self.free: IntArray = np.full((count, max(width, 1)), -1, dtype=np.int64)
        for i, node in enumerate(self.nodes):
            self.free[i, : node.gpus] = MILLI_PER_GPU
        self.models = sorted({n.model for n in self.nodes})
        model_index = {m: k for k, m in enumerate(self.models)}
        self.model_id: IntArray = np.array(
            [model_index[n.model] for n in self.nodes], dtype=np.int64
        )
        order = list(range(count))
        random.Random(seed).shuffle(order)
        self.rank: IntArray = np.empty(count, dtype=np.int64)
        self.rank[order] = np.arange(count)
        self.version: IntArray = np.zeros(count, dtype=np.int64)
        self.capacity = capacity_milli(self.nodes)
        self._spec_masks: dict[tuple[str, ...], BoolArray] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def model_mask(self, spec: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model the spec allows."""
        mask = self._spec_masks.get(spec)
        if mask is None:
            ids = [k for k, m in enumerate(self.models) if m in spec]
            mask = np.isin(self.model_id, ids)
            self._spec_masks[spec] = mask
        return mask

    def feasible(self, pod: TracePod) -> BoolArray:
        """The paper's feasibility rule for every node at once."""
        mask: BoolArray = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        if pod.gpu_spec:
            mask &= self.model_mask(pod.gpu_spec)
        if pod.num_gpu:
            mask &= (self.free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return mask

    def failure(self, pod: TracePod) -> str:
        """Why no node fits, named by the first requirement that leaves no candidate."""
        mask = np.ones(len(self), dtype=np.bool_)
        checks: list[tuple[str, BoolArray]] = []
        if pod.gpu_spec:
            checks.append(("GPU model", self.model_mask(pod.gpu_spec)))
        if pod.num_gpu > 1 or pod.gpu_milli == MILLI_PER_GPU:
            what = f"{pod.num_gpu} whole GPU(s)"
        else:
            what = "GPU share"
        if pod.num_gpu:
            checks.append((what, (self.free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu))
        checks += [("CPU", self.cpu >= pod.cpu_milli), ("host memory", self.mem >= pod.memory_mib)]
        for name, check in checks:
            mask &= check
            if not mask.any():
                return name
        return "combination"

    def free_of(self, i: int) -> list[int]:
        """The free share of node i's GPUs, by index."""
        shares: list[int] = self.free[i, : int(self.gpus[i])].tolist()
        return shares

    def best_fit_gpus(self, i: int, pod: TracePod, free: list[int] | None = None) -> list[int]:
        """The tightest GPU for a fractional pod; the lowest-index free GPUs for whole ones
        (``free``: node i's ``free_of``, when the caller has it)."""
        if pod.num_gpu == 0:
            return []
        if free is None:
            free = self.free_of(i)
        if pod.gpu_milli < MILLI_PER_GPU:
            return [min((f, g) for g, f in enumerate(free) if f >= pod.gpu_milli)[1]]
        whole = [g for g, f in enumerate(free) if f == MILLI_PER_GPU]
        if self.aware and pod.num_gpu > 1 and self.distance[i]:
            rows = {g: g for g in whole}  # a GPU's index is its row of the matrix
            return list(closest_set(whole, pod.num_gpu, self.distance[i], rows))
        return whole[: pod.num_gpu]

    def place(self, i: int, pod: TracePod, gpus: Sequence[int]) -> None:
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        for g in gpus:
            self.free[i, g] -= pod.gpu_milli
        self.version[i] += 1

    def pick(self, mask: BoolArray, *keys: FloatArray) -> int:
        """The node maximising the keys in order among ``mask``; remaining ties by rank."""
        candidates = np.flatnonzero(mask)
        for key in keys:
            values = key[candidates]
            candidates = candidates[values == values.max()]
            if len(candidates) == 1:
                return int(candidates[0])
        return int(candidates[np.argmin(self.rank[candidates])])

    def idle(self) -> IntArray:
        """Free GPU share per node (the -1 padding of absent GPUs left out)."""
        idle: IntArray = np.where(self.free > 0, self.free, 0).sum(axis=1)
        return idle

    def bestfit_scores(self, pod: TracePod) -> FloatArray:
        """The paper's BestFit score for every node."""
        cpu_left = (self.cpu - pod.cpu_milli) / CPU_NORM
        gpu_left = (self.idle() - pod.gpu_request_milli) / (GPU_NORM)
        scores: FloatArray = 1.0 - (cpu_left + gpu_left) / 2
        return scores


Choice = tuple[int, list[int]]


class PlacementPolicy(Protocol):
    """The simulator's placement policy: chooses a node and its GPUs among the feasible ones
    (not the cGPU time-slicing policy, ``isolation.policy.Policy``)."""

    name: str

    def observe(self, pod: TracePod) -> None:
        """Every arriving pod, before it is placed (online policies learn from it)."""
        ...

    def choose(self, cluster: Cluster, pod: TracePod, mask: BoolArray) -> Choice:
        """Where to place the pod; ``mask`` has at least one feasible node."""
        ...


class BestFit:
    """The paper's BestFit: least normalised CPU and GPU left over; tightest GPU."""

    name = "bestfit"

    def observe(self, pod: TracePod) -> None:
        """BestFit learns nothing."""

    def choose(self, cluster: Cluster, pod: TracePod, mask: BoolArray) -> Choice:
        node = cluster.pick(mask, cluster.bestfit_scores(pod))
        return node, cluster.best_fit_gpus(node, pod)


@dataclass
class _Scores:
    """Cached per-node scores for one pod shape, valid while the node's version matches."""

    score: FloatArray
    gpu: IntArray
    version: IntArray


class FragmentationPolicy:
    """The core's ``Defragmenter`` over the cluster's arrays, in milli-GPU (FGD and gpushare).

    ``fgd`` is the paper's definition: truncated integer scores, the whole trace's shape
    statistics, the first GPU with the best truncated score. ``online`` learns the workload
    from the arriving pods; the rest (truncation, tightest GPU, copies) is the core's policy,
    the same code the extender runs. Per-node scores are cached per pod shape while the node's
    version and the workload stay the same.
    """

    def __init__(
        self,
        name: str,
        workload: WorkloadEstimate,
        *,
        online: bool = False,
        variant: Variant = FGD,
    ) -> None:
        self.name = name
        self.workload = workload
        self.online = online
        self.defragmenter = Defragmenter(workload, variant, memo_limit=1_000_000)
        self._cache: dict[tuple[int, int, int], _Scores] = {}
        self._workload_version = workload.version
        self._prices = self.defragmenter.prices
        """The workload version and prices the cached scores were made under."""
        self._cluster: Cluster | None = None
        self._told: IntArray = np.zeros(0, dtype=np.int64)
        """Each node's version the supply was last told."""

    def observe(self, pod: TracePod) -> None:
        if self.online:
            self.workload.observe(shape_of(pod))

    def node_score(
        self, cluster: Cluster, i: int, pod: TracePod, shape: Shape | None = None
    ) -> tuple[float, int]:
        """The node's score for the pod and the chosen GPU (-1: whole GPUs or none)."""
        free = cluster.free_of(i)
        cpu = int(cluster.cpu[i])
        model = cluster.nodes[i].model
        shape = shape or shape_of(pod)
        built = float(cluster.built[i])
        balance = self.defragmenter.balance(free, cpu, shape, MILLI_PER_GPU, built)
        if pod.num_gpu == 1 and pod.gpu_milli < MILLI_PER_GPU:
            fitting = [g for g, share in enumerate(free) if share >= pod.gpu_milli]
            score, gpu = self.defragmenter.best_gpu(free, cpu, model, shape, fitting, MILLI_PER_GPU)
            return score + balance, gpu
        positions = cluster.best_fit_gpus(i, pod, free)
        growth = self.defragmenter.growth(free, cpu, model, shape, positions)
        return self.defragmenter.score(growth, MILLI_PER_GPU) + balance, -1

    def _forget_holders(self, cluster: Cluster, shapes: Sequence[Shape]) -> None:
        """After a price change: forget the scores of nodes that can host a changed shape.

        A node with no copy of a shape before a placement has none after it either, so its
        score and GPU choice do not read that shape's price; on a filling cluster most price
        changes concern shapes few nodes can still host.
        """
        holders = np.zeros(len(cluster), dtype=np.bool_)
        for shape in shapes:
            can = (cluster.free >= shape.per_gpu).sum(axis=1) >= shape.count
            if shape.cpu > 0:
                can &= cluster.cpu > 0
            if shape.models:
                can &= cluster.model_mask(shape.models)
            holders |= can
        for entry in self._cache.values():
            entry.version[holders] = -1

    def tell(self, cluster: Cluster) -> None:
        """Tell the scarce shapes' supply every node that changed since the last call."""
        supply = self.defragmenter.supply
        if supply is None:
            return
        if cluster is not self._cluster:
            self._cluster = cluster
            self._told = np.full(len(cluster), -1, dtype=np.int64)
            supply.clear()
        changed = np.flatnonzero(cluster.version != self._told)
        for i in changed.tolist():
            shares = tuple(sorted(cluster.free_of(i)))
            supply.update(i, (shares, int(cluster.cpu[i]), cluster.nodes[i].model))
        self._told[changed] = cluster.version[changed]

    def choose(self, cluster: Cluster, pod: TracePod, mask: BoolArray) -> Choice:
        self.tell(cluster)
        prices = self.defragmenter.prices  # a new object whenever a rounded price changes
        if self.workload.version != self._workload_version:
            self._cache.clear()
        elif prices is not self._prices:
            self._forget_holders(cluster, changed(self._prices, prices))
        self._workload_version = self.workload.version
        self._prices = prices
        key = (pod.cpu_milli, pod.gpu_milli, pod.num_gpu)  # what a node's score depends on
        entry = self._cache.get(key)
        if entry is None:
            n = len(cluster)
            entry = _Scores(
                np.zeros(n, dtype=np.float64),
                np.full(n, -1, dtype=np.int64),
                np.full(n, -1, dtype=np.int64),
            )
            self._cache[key] = entry
        stale = np.flatnonzero(mask & (entry.version != cluster.version))
        shape = shape_of(pod)
        for i in stale.tolist():
            entry.score[i], entry.gpu[i] = self.node_score(cluster, i, pod, shape)
            entry.version[i] = cluster.version[i]
        node = cluster.pick(mask, entry.score)
        gpu = int(entry.gpu[node])
        return node, ([gpu] if gpu >= 0 else cluster.best_fit_gpus(node, pod))


def changed(before: Prices, after: Prices) -> list[Shape]:
    """Shapes whose price differs between two sets of prices (set, removed or moved)."""
    old, new = dict(before.shapes), dict(after.shapes)
    return [shape for shape in old.keys() | new.keys() if old.get(shape) != new.get(shape)]


def fgd(pods: Sequence[TracePod]) -> FragmentationPolicy:
    """The paper's FGD, with its target workload taken from the whole original trace."""
    return FragmentationPolicy("fgd", WorkloadEstimate.of([shape_of(p) for p in pods]))


POLICIES = ("bestfit", "fgd", "fgd-continuous", "gpushare")
"""Policies the simulator knows, by name."""


def make_policy(name: str, pods: Sequence[TracePod]) -> PlacementPolicy:
    """A fresh policy by name; ``pods`` is the original trace (FGD's offline statistics).

    - ``bestfit`` and ``fgd``: the paper's definitions.
    - ``fgd-continuous``: FGD without the integer truncation (nearly no ties).
    - ``gpushare``: the core's ``GPUSHARE`` variant, the extender's policy: FGD's truncated score
      over fragmentation counted by copies (see
      ``core.placement.fragmentation``: the idle share that as many pods of each shape as the node
      can
      hold, by GPU room and CPU, would leave), with the target workload learned online from
      the pods that arrived so far (nothing from the future of the stream) and covering 97 %
      of them. Ties as FGD's.
    """
    if name == "bestfit":
        return BestFit()
    if name == "fgd":
        return fgd(pods)
    if name == "fgd-continuous":
        workload = WorkloadEstimate.of([shape_of(p) for p in pods])
        return FragmentationPolicy(name, workload, variant=replace(FGD, truncate=False))
    if name == "gpushare":
        workload = learned_workload()
        return FragmentationPolicy(name, workload, online=True, variant=GPUSHARE)
    known = ", ".join(POLICIES)
    raise ValueError(f"policy={name!r} is not known; choose one of: {known}")


@dataclass
class Run:
    """One seed's replay: the curve of (arrived %, unallocated %) after every pod."""

    policy: str = ""
    arrived: list[float] = field(default_factory=list)
    unallocated: list[float] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=dict)
    fragmentation: list[tuple[float, float]] = field(default_factory=list)
    """(arrived %, fragmented share of capacity %) sampled along the run."""
    connected: tuple[int, int] = (0, 0)
    """Multi-GPU pods placed on nodes with a topology, and those given a best-connected set
    (``sim.links``); (0, 0) without a topology."""

    def at(self, percent: int) -> float:
        """Mean unallocated % over events whose round(arrived %) is ``percent`` (else +-1)."""
        for width in (0, 1):
            values = [
                u
                for a, u in zip(self.arrived, self.unallocated, strict=True)
                if abs(round(a) - percent) <= width
            ]
            if values:
                return sum(values) / len(values)
        return float("nan")


def replay(
    nodes: Sequence[TraceNode],
    stream: Sequence[TracePod],
    policy: PlacementPolicy,
    *,
    seed: int = 0,
    measure: WorkloadEstimate | None = None,
    samples: int = 0,
    topology: str = "",
    aware: bool = False,
) -> Run:
    """Place every pod of the stream once, in order.

    With ``measure`` and ``samples``, the cluster's fragmentation against that workload is
    recorded about ``samples`` times along the run, three quarters of them between 90 and
    130 % arrived, where the policies part (``sample_points``). ``topology`` names a layout
    of ``core.model.topology.LAYOUTS`` the nodes take; ``aware``: multi-GPU pods follow it.
    """
    cluster = Cluster(nodes, seed=seed, topology=topology, aware=aware)
    connected = Connected()
    run = Run(policy=policy.name)
    requested = allocated = 0
    due = sample_points(samples)
    for step, pod in enumerate(stream):
        policy.observe(pod)
        requested += pod.gpu_request_milli
        mask = cluster.feasible(pod)
        if mask.any():
            node, gpus = policy.choose(cluster, pod, mask)
            cluster.place(node, pod, gpus)
            allocated += pod.gpu_request_milli
            connected.record(gpus, cluster.distance[node])
        else:
            reason = cluster.failure(pod)
            run.failed[reason] = run.failed.get(reason, 0) + 1
        run.arrived.append(100.0 * requested / cluster.capacity)
        run.unallocated.append(100.0 - 100.0 * allocated / cluster.capacity)
        if measure is None or not samples:
            continue
        if (due and run.arrived[-1] >= due[0]) or step == len(stream) - 1:
            while due and run.arrived[-1] >= due[0]:
                due.pop(0)
            run.fragmentation.append((run.arrived[-1], cluster_fragmentation(cluster, measure)))
    run.connected = connected.counts
    return run


def sample_points(samples: int) -> list[float]:
    """Arrived % at which to measure fragmentation: a quarter below 90 %, the rest to 130 %."""
    if samples <= 0:
        return []
    low = max(1, samples // 4)
    high = max(1, samples - low)
    return [90.0 * k / low for k in range(low)] + [90.0 + 40.0 * k / high for k in range(high)]


def cluster_fragmentation(cluster: Cluster, measure: WorkloadEstimate) -> float:
    """Fragmented idle share of the whole cluster, in % of its GPU capacity."""
    top = measure.top()
    total = 0.0
    for i, node in enumerate(cluster.nodes):
        total += fragmentation(cluster.free_of(i), int(cluster.cpu[i]), node.model, top)
    return 100.0 * total / cluster.capacity
