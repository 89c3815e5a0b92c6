"""B1/B2: unallocated GPU % per policy on the shared openb traces (the FGD paper's protocol).

Runs every trace (default and gpushare40..100) with 10 seeds per policy and prints one table:
mean +- sd at 100 % arrived (and 130 %), beside the published FGD and BestFit values, and each
policy's difference to FGD seed by seed (mean +- sd: below zero and beyond the sd beats it). Every
number also lands in ``bench-out/<trace>/report.json`` with the plots.

    python benchmarks/policy_table.py [--seeds 10] [--workers 2] [--trace default ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpushare.sim import report
from gpushare.sim.experiment import run_experiment
from gpushare.sim.openb import read_nodes, read_pods

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NAMES = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--trace", action="append", choices=NAMES)
    parser.add_argument("--policy", action="append")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    policies = args.policy or ["bestfit", "fgd", "gpushare"]
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    rows = []
    for name in args.trace or NAMES:
        pods = read_pods(TRACES / f"openb_pod_list_{name}.csv")
        started = time.perf_counter()
        experiment = run_experiment(
            name,
            nodes,
            pods,
            policies,
            list(range(args.seeds)),
            workers=args.workers,
            progress=lambda r: print(".", end="", flush=True),
        )
        report.write(experiment, args.out / name)
        print(f" {name} in {time.perf_counter() - started:.0f} s", flush=True)
        rows += report.versus_rows(experiment, published=True)
    print(f"\nunallocated GPU %, mean +- sd over {args.seeds} seeds")
    print("\n".join(report.versus_header(published=True, reference="fgd", paired=(100,))))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
