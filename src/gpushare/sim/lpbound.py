"""A lower bound on unallocated GPU % for any policy, online or not, as a linear program.

The GPU requests that arrived by a point are cut into 1000-milli GPUs as a linear program over
packing patterns (every multiset of per-GPU shares that fits one GPU): the program chooses how
many GPUs use each pattern, and may drop any pod, to allocate the most milli-GPU. CPU, memory,
GPU models, node boundaries and the order of arrival are ignored, which only makes the bound
lower; a k-GPU pod counts as k whole GPUs. No placement under the paper's protocol can leave
less unallocated than this.

The protocol's value at X % arrived is the mean over the events whose arrived % rounds to X, so
the bound at X counts every pod that arrived by X + 0.5 %: more pods can only lower the bound,
and every one of those events has at most that many pods.

It needs scipy (``pip install -e '.[bench]'``); ``available()`` says whether it is there, and
the report falls back to the offline first-fit-decreasing packing, which is no bound.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod
from gpushare.sim.stream import arrival_stream, capacity_milli


def available() -> bool:
    """Whether scipy, which solves the program, is installed."""
    return importlib.util.find_spec("scipy") is not None


def arrived_shares(stream: Sequence[TracePod], limit_milli: float) -> Counter[int]:
    """Per-GPU shares (a k-GPU pod is k shares) of the pods arrived by ``limit_milli``."""
    shares: Counter[int] = Counter()
    requested = 0
    for pod in stream:
        requested += pod.gpu_request_milli
        if requested > limit_milli:
            break
        if pod.num_gpu:
            shares[pod.gpu_milli] += pod.num_gpu
    return shares


def patterns(shares: Counter[int]) -> list[tuple[int, ...]]:
    """Every non-empty multiset of the share sizes that fits one GPU (counts per size)."""
    sizes = sorted(shares)
    found: list[tuple[int, ...]] = []

    def extend(i: int, room: int, counts: list[int]) -> None:
        if i == len(sizes):
            if any(counts):
                found.append(tuple(counts))
            return
        k = 0
        while k * sizes[i] <= room and k <= shares[sizes[i]]:
            counts.append(k)
            extend(i + 1, room - k * sizes[i], counts)
            counts.pop()
            k += 1

    extend(0, MILLI_PER_GPU, [])
    return found


def solve(shares: Counter[int], gpus: int, capacity_milli: int) -> float:
    """The least unallocated % of ``capacity_milli`` that ``gpus`` GPUs can leave."""
    linprog = importlib.import_module("scipy.optimize").linprog  # scipy ships no type hints

    if not shares:
        return 100.0
    sizes = sorted(shares)
    table = np.array(patterns(shares), dtype=np.float64)
    volume = table @ np.array(sizes, dtype=np.float64)
    limits = np.vstack([np.ones(len(table)), table.T])
    room = np.array([gpus] + [shares[s] for s in sizes], dtype=np.float64)
    result = linprog(-volume, A_ub=limits, b_ub=room, bounds=(0, None), method="highs")
    if not result.success:
        raise RuntimeError(f"the LP did not solve: {result.message}")
    return 100.0 - 100.0 * float(-result.fun) / capacity_milli


def bound(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    seed: int,
    points: Sequence[int],
    *,
    tune: float = 1.3,
) -> dict[int, float]:
    """The LP bound on unallocated % at each arrived % of ``points`` for one seed's stream."""
    capacity = capacity_milli(nodes)
    gpus = capacity // MILLI_PER_GPU
    stream = arrival_stream(pods, nodes, seed=seed, tune=tune)
    return {
        point: solve(arrived_shares(stream, (point + 0.5) / 100 * capacity), gpus, capacity)
        for point in points
    }
