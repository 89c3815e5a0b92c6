"""Unallocated GPU % per policy on multi-GPU-heavy mixes built from the openb default trace.

Each mix keeps every pod of the default trace and resamples its whole-GPU multi-GPU pods (2, 4
and 8 GPUs) until they carry 20, 30, 40 or 50 % of the GPU demand (``sim.mixes``, mix seed 0,
so every run builds the same mixes). The protocol is the paper's (shuffle and inflate per run
seed; no LP bound, to keep the run cheap). The table is policy_table's: mean +- sd at 100 %
and 130 % arrived, and each policy minus FGD paired by seed. Reports land in
``bench-out/mixes/<mix>/``. The mixes are built in memory; nothing is written beside the traces.

    python benchmarks/mix_table.py [--seeds 10] [--workers 2] [--share 0.4 ...] [--policy ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpushare.sim import report
from gpushare.sim.experiment import run_experiment
from gpushare.sim.mixes import SHARES, multigpu_mix, multigpu_share
from gpushare.sim.openb import read_nodes, read_pods

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
PAIRED = (100, 130)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--share", type=float, action="append", help="multi-GPU share, 0..1")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "mixes")
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    policies = args.policy or ["bestfit", "fgd", "gpushare"]
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    trace = read_pods(TRACES / "openb_pod_list_default.csv")
    rows = []
    for share in args.share or SHARES:
        name = f"multigpu{round(100 * share)}"
        pods = multigpu_mix(trace, share, seed=0)
        print(f"{name}: {len(pods)} pods, {100 * multigpu_share(pods):.1f} % ", end="", flush=True)
        started = time.perf_counter()
        experiment = run_experiment(
            name,
            nodes,
            pods,
            policies,
            list(range(args.seeds)),
            workers=args.workers,
            offline=False,
            lp_bound=False,
            progress=lambda r: print(".", end="", flush=True),
        )
        report.write(experiment, args.out / name)
        print(f" {time.perf_counter() - started:.0f} s", flush=True)
        rows += report.versus_rows(experiment, published=False, paired=PAIRED)
    print(f"\nmulti-GPU-heavy mixes of openb default, unallocated GPU %, {args.seeds} seeds")
    print("\n".join(report.versus_header(published=False, reference="fgd", paired=PAIRED)))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
