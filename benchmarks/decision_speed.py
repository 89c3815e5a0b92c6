"""B3: per-pod decision latency (filter + score + GPU choice), in-process, on the openb stream.

For each policy, on the 1213-node cluster and on its x4 replica (4852 nodes, stream x4):
p50 / p99 / max in microseconds split by arrived % (0-50, 50-90, 90-130), pods/s over the
whole stream, and each figure as a ratio to BestFit measured in the same run.

    python benchmarks/decision_speed.py [--replicas 1 4] [--policy bestfit --policy fgd ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gpushare.sim.milligpu import Cluster, make_policy
from gpushare.sim.openb import TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.stream import arrival_stream

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
BANDS = ((0, 50), (50, 90), (90, 131))


def replicate(nodes: list[TraceNode], pods: list[TracePod], k: int):
    if k == 1:
        return nodes, pods
    bigger_nodes = [replace(n, name=f"{n.name}-r{r}") for r in range(k) for n in nodes]
    bigger_pods = [replace(p, name=f"{p.name}-r{r}") for r in range(k) for p in pods]
    return bigger_nodes, bigger_pods


Quantiles = tuple[float, float, float]


@dataclass
class Measured:
    """One policy's decision latencies (p50, p99, max in microseconds) and throughput."""

    pods: int
    pods_per_s: float
    bands: dict[str, Quantiles]
    overall: Quantiles


def measure(nodes, pods, policy_name: str, seed: int = 0) -> Measured:
    stream = arrival_stream(pods, nodes, seed=seed)
    cluster = Cluster(nodes, seed=seed)
    policy = make_policy(policy_name, pods)
    bands: dict[tuple[int, int], list[float]] = {b: [] for b in BANDS}
    requested = 0
    clock = time.perf_counter_ns
    started = clock()
    for pod in stream:
        policy.observe(pod)
        requested += pod.gpu_request_milli
        arrived = 100.0 * requested / cluster.capacity
        t0 = clock()
        mask = cluster.feasible(pod)
        choice = policy.choose(cluster, pod, mask) if mask.any() else None
        t1 = clock()
        if choice is not None:
            cluster.place(choice[0], pod, choice[1])
        for low, high in BANDS:
            if low <= arrived < high:
                bands[(low, high)].append((t1 - t0) / 1000)
    total = (clock() - started) / 1e9
    everything = [v for values in bands.values() for v in values]
    return Measured(
        len(stream),
        len(stream) / total,
        {f"{low}-{min(high, 130)}": _quantiles(v) for (low, high), v in bands.items()},
        _quantiles(everything),
    )


def _quantiles(values: list[float]) -> Quantiles:
    if not values:
        return (0.0, 0.0, 0.0)
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (statistics.median(ordered), p99, ordered[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--policy", action="append")
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    policies = args.policy or ["bestfit", "fgd", "gpushare"]
    if "bestfit" not in policies:
        policies.insert(0, "bestfit")
    base_nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    base_pods = read_pods(TRACES / "openb_pod_list_default.csv")
    for k in args.replicas:
        nodes, pods = replicate(base_nodes, base_pods, k)
        print(f"\n{len(nodes)} nodes, default trace x{k}")
        print(
            "| policy | pods | pods/s | ratio to bestfit | p50 us | p99 us | max us | "
            "p99 us 0-50 / 50-90 / 90-130 |"
        )
        print("|---|---|---|---|---|---|---|---|")
        reference = None
        for name in policies:
            result = measure(nodes, pods, name)
            rate = result.pods_per_s
            reference = reference or rate
            p50, p99, top = result.overall
            bands = " / ".join(f"{q[1]:.0f}" for q in result.bands.values())
            print(
                f"| {name} | {result.pods} | {rate:.0f} | {rate / reference:.2f} | "
                f"{p50:.0f} | {p99:.0f} | {top:.0f} | {bands} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
