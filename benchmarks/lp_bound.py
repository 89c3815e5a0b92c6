"""A lower bound on unallocated GPU % at 100 % arrived, for any policy, online or not.

The GPU requests that arrived by 100 % are cut into 1000-milli GPUs as a linear program over
packing patterns (every multiset of per-GPU shares that fits one GPU): the program chooses how
many GPUs use each pattern, and may drop any pod, to allocate the most milli-GPU. CPU, memory,
GPU models, node boundaries and the order of arrival are ignored, which only makes the bound
lower; a k-GPU pod counts as k whole GPUs. No placement under the paper's protocol can leave
less unallocated than this.

    pip install scipy==1.17.1   # or: pip install -e '.[bench]'
    python benchmarks/lp_bound.py [--seeds 2] [--trace default ...]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.stream import arrival_stream, capacity_milli

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NAMES = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100")


def arrived_shares(stream: Sequence[TracePod], capacity: int) -> Counter[int]:
    """Per-GPU shares (a k-GPU pod is k shares) of the pods arrived by 100 %."""
    shares: Counter[int] = Counter()
    requested = 0
    for pod in stream:
        requested += pod.gpu_request_milli
        if pod.num_gpu:
            shares[pod.gpu_milli] += pod.num_gpu
        if requested >= capacity:
            break
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


def bound(nodes: Sequence[TraceNode], pods: Sequence[TracePod], seed: int) -> float:
    """The LP bound on unallocated % at 100 % arrived for one seed's stream."""
    from scipy.optimize import linprog

    capacity = capacity_milli(nodes)
    gpus = capacity // MILLI_PER_GPU
    shares = arrived_shares(arrival_stream(pods, nodes, seed=seed), capacity)
    sizes = sorted(shares)
    table = np.array(patterns(shares), dtype=np.float64)
    volume = table @ np.array(sizes, dtype=np.float64)
    limits = np.vstack([np.ones(len(table)), table.T])
    room = np.array([gpus] + [shares[s] for s in sizes], dtype=np.float64)
    result = linprog(-volume, A_ub=limits, b_ub=room, bounds=(0, None), method="highs")
    if not result.success:
        raise RuntimeError(f"the LP did not solve: {result.message}")
    return 100.0 - 100.0 * float(-result.fun) / capacity


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--trace", action="append", choices=NAMES)
    args = parser.parse_args()
    try:
        import scipy  # noqa: F401
    except ImportError:
        print("error: this bound needs scipy; run: pip install scipy==1.17.1")
        return 2
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    print("| trace | LP lower bound on unallocated % at 100% arrived, per seed |")
    print("|---|---|")
    for name in args.trace or NAMES:
        pods = read_pods(TRACES / f"openb_pod_list_{name}.csv")
        values = [bound(nodes, pods, seed) for seed in range(args.seeds)]
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
