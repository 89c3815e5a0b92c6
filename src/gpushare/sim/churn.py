"""The churn protocol: pods arrive and leave, and the cluster runs at a steady load.

The paper's protocol only adds pods, each tried once. A real cluster also finishes them, and a
pod that finds no room waits for one. Here:

- *Departures* come from the trace: each pod runs for its own deletion less creation time
  (``TracePod.duration_s``), at least ``MIN_RUN_S``; clones run as long as the pod they copy.
- *Arrivals* follow a stated model, because the trace's own creation times do not load the
  cluster: on openb default the GPUs its pods hold at any one time never pass 66 of 6,212.
  Users keep the cluster busy instead: whenever the GPU demand present (running plus waiting)
  is below ``load`` x capacity, the next pod of the seed's stream arrives (the paper's stream:
  the trace shuffled by seed and inflated with clones, here to ``volume`` x capacity). So the
  demand stays at the target, and a policy that packs worse has more of it waiting.
- *Waiting*: a pod that fits nowhere waits. After every departure the waiting pods are tried
  again, oldest first; any that fits is placed (a later pod may pass an earlier one that still
  does not fit, as kube-scheduler's queue allows).

Measured from the moment the demand first reaches the target to the last arrival (the
*window*), time-weighted: the unallocated GPU (capacity less the GPUs pods hold), the GPU demand
that waited (GPU-hours: each waiting pod's GPUs x its wait, inside the window), how many pods
waited and how long (hours, mean and longest; a pod still waiting at the end counts until then).
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpushare.sim.milligpu import BoolArray, Cluster, PlacementPolicy, make_policy
from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod
from gpushare.sim.stream import arrival_stream

MIN_RUN_S = 60
"""The shortest run: pods the trace deleted at once (failed at start) still hold their GPUs
for a minute, as a pod that starts and fails does."""

LOAD = 0.95
"""Target demand present, share of GPU capacity."""

VOLUME = 2.0
"""GPU demand of the whole stream, in cluster capacities: about one capacity of turnover after
the first fill (a seed of gpushare on openb default takes about 30 s on one free core)."""

SERIES = 120
"""Points of the unallocated-over-time series kept per run (on the window)."""

HOUR = 3600.0


@dataclass
class ChurnRun:
    """One policy on one seed under churn."""

    policy: str
    seed: int
    unallocated_pct: float = math.nan
    """Time-weighted mean unallocated GPU over the window, % of capacity."""
    unallocated_gpus: float = math.nan
    waited_gpu_hours: float = 0.0
    waited_pods: int = 0
    mean_wait_h: float = 0.0
    longest_wait_h: float = 0.0
    arrived: int = 0
    seconds: float = 0.0
    """How long the run took (the progress line says it)."""
    window_h: float = 0.0
    series: list[tuple[float, float, float]] = field(default_factory=list)
    """(hours into the window, unallocated GPUs, waiting GPUs) on ``SERIES`` evenly spaced
    points."""


@dataclass
class _Running:
    pod: TracePod
    node: int
    gpus: list[int]


def remove(cluster: Cluster, i: int, pod: TracePod, gpus: Sequence[int]) -> None:
    """Give a departed pod's CPU, memory and GPU share back to node i."""
    cluster.cpu[i] += pod.cpu_milli
    cluster.mem[i] += pod.memory_mib
    for g in gpus:
        cluster.free[i, g] += pod.gpu_milli
    cluster.version[i] += 1


def run_churn(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy_name: str,
    seed: int,
    *,
    load: float = LOAD,
    volume: float = VOLUME,
) -> ChurnRun:
    """One seed of the churn protocol under one simulator policy (``milligpu.POLICIES``)."""
    began = time.perf_counter()
    policy: PlacementPolicy = make_policy(policy_name, pods)
    cluster = Cluster(nodes, seed=seed)
    capacity = cluster.capacity
    stream = deque(arrival_stream(pods, nodes, seed=seed, tune=volume))
    target = load * capacity
    clock = 0.0
    present = 0  # milli-GPU demand running or waiting
    held = 0  # milli-GPU held by running pods
    queued = 0  # milli-GPU of the waiting pods
    waiting: list[tuple[float, int, TracePod]] = []  # (since, order, pod), oldest first
    departures: list[tuple[float, int, _Running]] = []
    order = 0
    start: float | None = None
    last = 0.0
    area_unallocated = 0.0
    area_waiting = 0.0
    waits: list[float] = []
    marks: list[tuple[float, int, int]] = []  # (time, held, queued), inside the window
    run = ChurnRun(policy_name, seed)

    def advance(to: float) -> None:
        nonlocal last, area_unallocated, area_waiting
        if start is not None and to > last:
            span = to - last
            area_unallocated += (capacity - held) * span
            area_waiting += queued * span
        last = to

    def place(pod: TracePod, mask: BoolArray | None = None) -> bool:
        nonlocal held, order
        if mask is None:
            mask = cluster.feasible(pod)
        if not mask.any():
            return False
        node, gpus = policy.choose(cluster, pod, mask)
        cluster.place(node, pod, gpus)
        held += pod.gpu_request_milli
        end = clock + max(MIN_RUN_S, pod.duration_s)
        order += 1
        heapq.heappush(departures, (end, order, _Running(pod, node, list(gpus))))
        return True

    def retry(i: int) -> None:
        """After a departure from node i: a waiting pod fitted nowhere when last tried, and
        since then only placements (which take) and this departure changed the cluster, so
        node i is the one node where it may fit now."""
        nonlocal waiting, queued
        still: list[tuple[float, int, TracePod]] = []
        model = cluster.nodes[i].model
        cpu, mem = int(cluster.cpu[i]), int(cluster.mem[i])
        free = cluster.free_of(i)
        for entry in waiting:
            pod = entry[2]
            if (
                pod.cpu_milli <= cpu
                and pod.memory_mib <= mem
                and (not pod.gpu_spec or model in pod.gpu_spec)
                and sum(1 for f in free if f >= pod.gpu_milli) >= pod.num_gpu
            ):
                only = np.zeros(len(cluster), dtype=np.bool_)
                only[i] = True
                place(pod, only)
                queued -= pod.gpu_request_milli
                if start is not None:
                    waits.append(clock - max(entry[0], start))
                cpu, mem = int(cluster.cpu[i]), int(cluster.mem[i])
                free = cluster.free_of(i)
                continue
            still.append(entry)
        waiting = still

    def arrive() -> None:
        nonlocal present, start, order, queued
        while stream and present < target:
            pod = stream.popleft()
            policy.observe(pod)
            present += pod.gpu_request_milli
            run.arrived += 1
            if not place(pod):
                order += 1
                queued += pod.gpu_request_milli
                waiting.append((clock, order, pod))
        if start is None and present >= target:
            start = clock

    arrive()
    if start is not None:
        marks.append((clock, held, queued))
    while stream and departures:
        end, _, gone = heapq.heappop(departures)
        advance(end)
        clock = end
        remove(cluster, gone.node, gone.pod, gone.gpus)
        held -= gone.pod.gpu_request_milli
        present -= gone.pod.gpu_request_milli
        retry(gone.node)
        arrive()
        if start is not None:
            marks.append((clock, held, queued))
    if start is None:
        return run
    waits += [clock - max(since, start) for since, _, _ in waiting if clock > max(since, start)]
    window = clock - start
    run.window_h = window / HOUR
    if window > 0:
        run.unallocated_pct = 100.0 * area_unallocated / (capacity * window)
        run.unallocated_gpus = area_unallocated / (MILLI_PER_GPU * window)
    run.waited_gpu_hours = area_waiting / (MILLI_PER_GPU * HOUR)
    run.waited_pods = len(waits)
    run.mean_wait_h = statistics.fmean(waits) / HOUR if waits else 0.0
    run.longest_wait_h = max(waits, default=0.0) / HOUR
    run.series = _series(marks, start, window, capacity)
    run.seconds = time.perf_counter() - began
    return run


def _series(
    marks: Sequence[tuple[float, int, int]], start: float, window: float, capacity: int
) -> list[tuple[float, float, float]]:
    """Unallocated and waiting GPUs at ``SERIES`` evenly spaced times of the window."""
    if window <= 0 or not marks:
        return []
    out: list[tuple[float, float, float]] = []
    j = 0
    for k in range(SERIES):
        at = start + window * k / (SERIES - 1)
        while j + 1 < len(marks) and marks[j + 1][0] <= at:
            j += 1
        _, held, queued = marks[j]
        out.append(((at - start) / HOUR, (capacity - held) / MILLI_PER_GPU, queued / MILLI_PER_GPU))
    return out
