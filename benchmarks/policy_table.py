"""B1/B2: unallocated GPU % per policy on the shared openb traces (the FGD paper's protocol).

Runs every trace (default and gpushare40..100) with 10 seeds per policy and prints one table:
mean +- sd at 100 % arrived (and 130 %), beside the published FGD and BestFit values, and each
policy's difference to FGD seed by seed (mean +- sd: below zero and beyond the sd beats it). Every
number also lands in ``bench-out/<trace>/report.json`` with the plots.

``--mixes`` runs multi-GPU-heavy mixes of the default trace instead: every pod kept, its
whole-GPU pods over 2, 4 and 8 GPUs resampled until they carry 20, 30, 40 and 50 % of the GPU
demand (``sim.mixes``, mix seed 0, so every run builds the same mixes; nothing is written beside
the traces), with no published value, offline reference or LP bound, each policy paired with
FGD and with BestFit (two tables) at 100 and 130 % arrived; reports in
``bench-out/mixes/multigpu<share>/``.

    python benchmarks/policy_table.py [--seeds 10] [--workers 2] [--trace default ...]
    python benchmarks/policy_table.py --mixes [--share 0.4 ...] [--policy ...]
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
NAMES = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--trace", action="append", choices=NAMES)
    parser.add_argument("--policy", action="append")
    parser.add_argument("--mixes", action="store_true", help="multi-GPU-heavy mixes of default")
    parser.add_argument("--share", type=float, action="append", help="--mixes: share, 0..1")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args()
    if not TRACES.exists():
        print(f"error: the openb traces are not at {TRACES}; put ../shared beside the project")
        return 2
    policies = args.policy or ["bestfit", "fgd", "gpushare"]
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    if args.mixes:
        default = read_pods(TRACES / "openb_pod_list_default.csv")
        workloads = [
            (f"multigpu{round(100 * share)}", multigpu_mix(default, share, seed=0))
            for share in args.share or SHARES
        ]
    else:
        names = args.trace or NAMES
        workloads = [(name, read_pods(TRACES / f"openb_pod_list_{name}.csv")) for name in names]
    paired = (100, 130) if args.mixes else (100,)
    # the mixes have no published values: each is paired with BestFit too (issue 44 asks both)
    references = ("fgd", "bestfit") if args.mixes else ("fgd",)
    rows: dict[str, list[str]] = {reference: [] for reference in references}
    for name, pods in workloads:
        if args.mixes:
            print(f"{name}: {100 * multigpu_share(pods):.1f} % multi-GPU ", end="", flush=True)
        started = time.perf_counter()
        experiment = run_experiment(
            name,
            nodes,
            pods,
            policies,
            list(range(args.seeds)),
            workers=args.workers,
            offline=not args.mixes,
            lp_bound=not args.mixes,
            progress=lambda r: print(".", end="", flush=True),
        )
        report.write(experiment, args.out / ("mixes" if args.mixes else "") / name)
        print(f" {name} in {time.perf_counter() - started:.0f} s", flush=True)
        for reference in references:
            rows[reference] += report.versus_rows(
                experiment, published=not args.mixes, reference=reference, paired=paired
            )
    what = "multi-GPU-heavy mixes of openb default" if args.mixes else "openb traces"
    for reference in references:
        if reference not in policies:
            continue
        print(f"\n{what}: unallocated GPU %, mean +- sd over {args.seeds} seeds")
        header = report.versus_header(published=not args.mixes, reference=reference, paired=paired)
        print("\n".join(header))
        print("\n".join(rows[reference]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
