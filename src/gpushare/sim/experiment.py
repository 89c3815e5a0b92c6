"""Several policies over several seeds of the paper's protocol, optionally in parallel processes.

Each (policy, seed) replay is independent, so they run in a process pool when ``workers`` > 1;
results come back as plain values (``SeedResult``) for the report.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from gpushare.core.placement.fragmentation import WorkloadEstimate
from gpushare.sim import gpumem as memory_mode
from gpushare.sim import lpbound
from gpushare.sim.draplacing import DraCluster
from gpushare.sim.milligpu import BestFit, Cluster, make_policy, replay, shape_of
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.stream import arrival_stream, capacity_milli

POINTS = (90, 95, 100, 110, 130)
"""Arrived % at which the protocol reports unallocated %."""

OFFLINE = "offline-ffd"
"""The offline reference's name in results."""

FRAGMENTATION_SAMPLES = 40
"""How often fragmentation is measured along each seed's run (about a second on the openb
cluster, against 10 to 60 for the run itself)."""

CURVE_POINTS = 261
"""Arrived % grid (0..130 by 0.5) on which curves are kept for the plot."""


@dataclass
class SeedResult:
    """One policy on one seed."""

    policy: str
    seed: int
    points: dict[int, float]
    curve: list[float] = field(default_factory=list)
    """Unallocated % on the arrived grid (NaN past the end of the stream)."""
    fragmentation: list[tuple[float, float]] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=dict)
    pods: int = 0
    seconds: float = 0.0
    connected: tuple[int, int] = (0, 0)
    """Multi-GPU pods on nodes with a topology, and those given a best-connected set."""


def _grid(arrived: Sequence[float], unallocated: Sequence[float]) -> list[float]:
    """Sample a step curve on the 0.5 % grid."""
    out: list[float] = []
    j = 0
    last = 100.0
    for k in range(CURVE_POINTS):
        x = k * 0.5
        while j < len(arrived) and arrived[j] <= x:
            last = unallocated[j]
            j += 1
        out.append(last if arrived and x <= arrived[-1] else math.nan)
    return out


def run_seed(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    tune: float,
    samples: int = FRAGMENTATION_SAMPLES,
    memory: memory_mode.MemorySettings | None = None,
    topology: str = "",
    aware: bool = False,
) -> SeedResult:
    """Replay one seed's stream under one policy (or the offline reference).

    Fragmentation is sampled ``samples`` times along the run (0: not at all; 40 samples
    cost about a second on the openb cluster, a tenth of an FGD run). With ``memory`` the
    extender's core places the pods in memory units (``sim.gpumem``) and ``policy`` is one of
    its node policies, in the allocation mode ``memory`` names (DRA mode: ``sim.draplacing``).
    ``topology`` gives the nodes a layout of
    ``core.model.topology.LAYOUTS``; ``aware``: multi-GPU pods follow it (in the memory mode,
    the nodes publish it to the core).
    """
    started = time.perf_counter()
    if memory is not None:
        stream = memory_mode.stream(pods, nodes, seed=seed, tune=tune, unit=memory.unit)
        if topology:
            memory = dataclasses.replace(memory, topology=topology, topology_aware=aware)
        kind = DraCluster if memory.allocation_mode == "dra" else None
        run = memory_mode.replay(nodes, stream, policy, seed=seed, settings=memory, kind=kind)
    elif policy == OFFLINE:
        stream = arrival_stream(pods, nodes, seed=seed, tune=tune)
        points = offline_reference(nodes, stream, seed=seed)
        return SeedResult(
            OFFLINE, seed, points, pods=len(stream), seconds=time.perf_counter() - started
        )
    else:
        stream = arrival_stream(pods, nodes, seed=seed, tune=tune)
        measure = WorkloadEstimate.of([shape_of(p) for p in pods]) if samples else None
        run = replay(
            nodes,
            stream,
            make_policy(policy, pods),
            seed=seed,
            measure=measure,
            samples=samples,
            topology=topology,
            aware=aware,
        )
    return SeedResult(
        policy,
        seed,
        {x: run.at(x) for x in POINTS},
        _grid(run.arrived, run.unallocated),
        run.fragmentation,
        dict(run.failed),
        len(stream),
        time.perf_counter() - started,
        run.connected,
    )


def offline_reference(
    nodes: Sequence[TraceNode], stream: Sequence[TracePod], *, seed: int = 0
) -> dict[int, float]:
    """Unallocated % when the pods that arrived by each point are packed knowing them all.

    First-fit-decreasing by GPU request (then CPU), each pod on the BestFit node. Not a bound:
    with CPU, memory and models binding too, a one-dimensional decreasing order can do worse
    than a good online policy, and the report says so.
    """
    capacity = capacity_milli(nodes)
    out: dict[int, float] = {}
    for point in POINTS:
        limit = point / 100 * capacity
        arrived: list[TracePod] = []
        total = 0
        for pod in stream:
            if total + pod.gpu_request_milli > limit:
                break
            total += pod.gpu_request_milli
            arrived.append(pod)
        cluster = Cluster(nodes, seed=seed)
        policy = BestFit()
        allocated = 0
        for pod in sorted(arrived, key=lambda p: (-p.gpu_request_milli, -p.cpu_milli)):
            mask = cluster.feasible(pod)
            if mask.any():
                node, gpus = policy.choose(cluster, pod, mask)
                cluster.place(node, pod, gpus)
                allocated += pod.gpu_request_milli
        out[point] = 100.0 - 100.0 * allocated / capacity
    return out


@dataclass
class Experiment:
    """Everything one ``gpushare simulate`` run measured."""

    trace: str
    nodes: int
    gpus: int
    tune: float
    seeds: list[int]
    policies: list[str]
    results: list[SeedResult]
    bound: dict[int, list[float]] = field(default_factory=dict)
    """The LP lower bound (``sim.lpbound``) at each point, one value per seed; empty when not
    computed (memory mode, no scipy)."""
    memory: bool = False
    """Counted in gpu-mem units (the extender's accounting) rather than milli-GPU: the
    report's GPUs are then GPUs' worth of memory."""

    def of(self, policy: str) -> list[SeedResult]:
        return [r for r in self.results if r.policy == policy]

    def differences(self, policy: str, reference: str, point: int) -> list[float]:
        """(policy - reference) at ``point`` on each seed both reached."""
        theirs = {r.seed: r.points[point] for r in self.of(reference)}
        return [
            r.points[point] - theirs[r.seed]
            for r in self.of(policy)
            if r.seed in theirs and not math.isnan(r.points[point] - theirs[r.seed])
        ]

    def paired(self, policy: str, reference: str, point: int) -> tuple[float, float]:
        """Mean and sd over seeds of (policy - reference), seed by seed.

        The same seed gives both policies the same stream and node order, so the paired
        difference shows an effect that the spread between seeds would hide.
        """
        diffs = self.differences(policy, reference, point)
        if not diffs:
            return math.nan, math.nan
        sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        return statistics.fmean(diffs), sd

    def values(self, policy: str, point: int) -> list[float]:
        """The policy's value at ``point`` on each seed that reached it."""
        return [r.points[point] for r in self.of(policy) if not math.isnan(r.points[point])]

    def summary(self, policy: str, point: int) -> tuple[float, float]:
        """Mean and sample standard deviation over seeds (sd 0 for one seed: see ``values``)."""
        values = self.values(policy, point)
        if not values:
            return math.nan, math.nan
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return statistics.fmean(values), sd


Progress = Callable[[SeedResult], None]


def run_experiment(
    trace: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    workers: int = 1,
    offline: bool = True,
    progress: Progress | None = None,
    memory: memory_mode.MemorySettings | None = None,
    lp_bound: bool = True,
    topology: str = "",
    aware: bool = False,
) -> Experiment:
    """Every policy (and the offline reference) on every seed, fragmentation sampled on each.

    With ``memory``, the memory-unit mode: no offline reference, no fragmentation and no LP
    bound (they count milli-GPU). ``lp_bound`` computes the LP lower bound per seed when scipy
    is installed. ``topology`` and ``aware`` as ``run_seed``'s.
    """
    names = list(policies) + ([OFFLINE] if offline and memory is None else [])
    jobs = [(name, seed) for name in names for seed in seeds]

    sampled = FRAGMENTATION_SAMPLES if memory is None else 0
    results: list[SeedResult] = []
    if workers <= 1:
        for name, seed in jobs:
            result = run_seed(nodes, pods, name, seed, tune, sampled, memory, topology, aware)
            results.append(result)
            if progress:
                progress(result)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(
                    run_seed,
                    nodes,
                    pods,
                    name,
                    seed,
                    tune,
                    sampled,
                    memory,
                    topology,
                    aware,
                )
                for name, seed in jobs
            ]
            for future in as_completed(futures):
                result = future.result()
                results.append(result)
                if progress:
                    progress(result)
    results.sort(key=lambda r: (names.index(r.policy), r.seed))
    bound: dict[int, list[float]] = {}
    if lp_bound and memory is None and lpbound.available():
        per_seed = [lpbound.bound(nodes, pods, seed, POINTS, tune=tune) for seed in seeds]
        bound = {point: [b[point] for b in per_seed] for point in POINTS}
    return Experiment(
        trace,
        len(nodes),
        sum(n.gpus for n in nodes),
        tune,
        list(seeds),
        names,
        results,
        bound,
        memory is not None,
    )
