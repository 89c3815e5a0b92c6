"""The churn protocol on the openb traces: pods arrive and leave, the cluster at a steady load.

Per trace and policy (``sim.churn``): pods run for their own time in the trace, the next pod of
the seed's stream arrives whenever the GPUs asked for (running and waiting) fall below 95 % of
capacity, and a pod that fits nowhere waits and is tried again after every departure. The
table gives the time-weighted idle GPUs, the GPU demand that waited (GPU-hours), how many pods
waited and for how long, and gpushare's difference to FGD and to BestFit paired by seed. The
plots land in ``bench-out/churn/<trace>/churn.png``.

    python benchmarks/churn_table.py [--seeds 10] [--workers 2] [--trace default ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpushare.sim import churnreport
from gpushare.sim.churn import LOAD, VOLUME
from gpushare.sim.openb import read_nodes, read_pods

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NAMES = ("default", "gpushare40", "gpushare100")
POLICIES = ("bestfit", "fgd", "gpushare")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--trace", action="append")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--load", type=float, default=LOAD, help="target share of capacity")
    parser.add_argument("--volume", type=float, default=VOLUME, help="stream, in capacities")
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "churn")
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    policies = args.policy or list(POLICIES)
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    rows = []
    for name in args.trace or NAMES:
        pods = read_pods(TRACES / f"openb_pod_list_{name}.csv")
        print(f"{name}: ", end="", flush=True)
        started = time.perf_counter()
        experiment = churnreport.run_churn_experiment(
            name,
            nodes,
            pods,
            policies,
            list(range(args.seeds)),
            load=args.load,
            volume=args.volume,
            workers=args.workers,
            progress=lambda run: print(".", end="", flush=True),
        )
        churnreport.write(experiment, args.out / name)
        print(f" {time.perf_counter() - started:.0f} s", flush=True)
        for reference in ("fgd", "bestfit"):
            if reference in policies:
                rows.append((reference, churnreport.rows(experiment, reference)))
    for reference in ("fgd", "bestfit"):
        chosen = [row for ref, block in rows if ref == reference for row in block]
        if chosen:
            print(f"\nchurn at {100 * args.load:.0f} % of capacity, {args.seeds} seeds")
            print("\n".join(churnreport.header(reference)))
            print("\n".join(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
