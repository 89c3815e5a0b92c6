"""How far apart two near-identical policies land, paired by seed: what "beyond the sd" means.

The policy tables pair every policy with FGD seed by seed and call a difference real when its
mean lies beyond its sd. This prints what that sd is when nothing of substance differs: FGD
against FGD whose target workload keeps the most frequent shapes up to ``--coverage`` of the
pods (0.96) instead of the paper's 0.95, which moves a shape or two in or out of the measure.
Same streams, same node order, same protocol (the paper's: unallocated GPU % at 100 % arrived).
A single placement that differs early sends the two runs down different paths, so the paired
sd of this pair is the floor that any two policies of equal quality show.

    python benchmarks/noise_floor.py [--seeds 10] [--workers 2] [--share 0.4 ...] [--trace default]

Without ``--share`` and ``--trace`` it runs the four multi-GPU-heavy mixes of ``sim.mixes``
(mix seed 0, as ``policy_table.py --mixes`` builds them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpushare.core.placement.fragmentation import WorkloadEstimate
from gpushare.sim.milligpu import FragmentationPolicy, fgd, replay, shape_of
from gpushare.sim.mixes import SHARES, multigpu_mix
from gpushare.sim.openb import TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.report import spread
from gpushare.sim.stream import arrival_stream

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
TUNE = 1.3
POINT = 100


def one_seed(
    nodes: list[TraceNode], pods: list[TracePod], seed: int, coverage: float
) -> tuple[float, float]:
    """(FGD, FGD at ``coverage``) unallocated % at 100 % arrived on one seed's stream."""
    stream = arrival_stream(pods, nodes, seed=seed, tune=TUNE)
    shapes = [shape_of(p) for p in pods]
    other = FragmentationPolicy("fgd", WorkloadEstimate.of(shapes, coverage=coverage))
    reference = replay(nodes, stream, fgd(pods), seed=seed).at(POINT)
    return reference, replay(nodes, stream, other, seed=seed).at(POINT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--coverage", type=float, default=0.96)
    parser.add_argument("--share", type=float, action="append", help="a mix's share, 0..1")
    parser.add_argument("--trace", action="append", help="an openb pod list, e.g. default")
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    if not 0.0 < args.coverage <= 1.0:
        print(f"error: --coverage {args.coverage} must lie in (0, 1]; the paper's is 0.95")
        return 2
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    default = read_pods(TRACES / "openb_pod_list_default.csv")
    workloads: list[tuple[str, list[TracePod]]] = []
    for name in args.trace or []:
        path = TRACES / f"openb_pod_list_{name}.csv"
        if not path.exists():
            print(f"error: --trace {name}: {path} does not exist; name one of the pod lists")
            return 2
        workloads.append((name, read_pods(path)))
    shares = args.share or ([] if args.trace else list(SHARES))
    for share in shares:
        workloads.append((f"multigpu{round(100 * share)}", multigpu_mix(default, share, seed=0)))
    print(
        f"FGD against FGD at {args.coverage:.2f} coverage, unallocated GPU % at {POINT} % "
        f"arrived, {args.seeds} seeds"
    )
    rows = []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for name, pods in workloads:
            started = time.perf_counter()
            print(f"{name}: ", end="", flush=True)
            futures = [
                pool.submit(one_seed, nodes, pods, seed, args.coverage)
                for seed in range(args.seeds)
            ]
            pairs = []
            for future in futures:
                pairs.append(future.result())
                print(".", end="", flush=True)
            print(f" {time.perf_counter() - started:.0f} s", flush=True)
            rows.append((name, pairs))
    print(
        "\n| workload | FGD | FGD at the other coverage | difference, paired "
        "| paired sd / sqrt(seeds) |"
    )
    print("|---|---|---|---|---|")
    for name, pairs in rows:
        diffs = [b - a for a, b in pairs]
        error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
        print(
            f"| {name} | {spread([a for a, _ in pairs])} | {spread([b for _, b in pairs])} "
            f"| {spread(diffs, signed=True, digits=3)} | {error:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
