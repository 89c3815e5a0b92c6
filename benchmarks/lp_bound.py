"""A lower bound on unallocated GPU % at 100 % arrived, for any policy, online or not.

The linear program is ``gpushare.sim.lpbound``'s (the simulator's report draws the same bound
at every reported point): the GPU requests that arrived are cut into 1000-milli GPUs with any
mix per GPU, any pod may be dropped, and CPU, memory, GPU models and node boundaries are
ignored, which only makes the bound lower.

    pip install scipy==1.17.1   # or: pip install -e '.[bench]'
    python benchmarks/lp_bound.py [--seeds 2] [--trace default ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpushare.sim import lpbound
from gpushare.sim.openb import read_nodes, read_pods

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NAMES = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--trace", action="append", choices=NAMES)
    args = parser.parse_args()
    if not lpbound.available():
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
        values = [lpbound.bound(nodes, pods, seed, [100])[100] for seed in range(args.seeds)]
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
