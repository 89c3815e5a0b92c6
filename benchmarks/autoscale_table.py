"""The autoscaling protocol on the openb traces: what each policy's packing costs in nodes.

Per trace and policy (``sim.autoscaling``): the cluster starts with no node; one node group per
node shape of the trace; a pod that fits no ready node GPU by GPU makes the autoscaler buy
nodes of the least-waste group, ready 3 minutes later; a node empty for 10 minutes is removed.
The churn protocol's pods arrive at the same times for every policy. The table gives node-hours,
GPU-hours bought, the pods that waited, and each policy's node-hours less FGD's and less
BestFit's paired by seed. The picture of the nodes bought over time (first seed) lands in
``bench-out/autoscale/<trace>/nodes.png``.

    python benchmarks/autoscale_table.py [--seeds 10] [--workers 2] [--trace default ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpushare.sim import autoscalereport
from gpushare.sim.autoscaling import LOAD, VOLUME, Settings
from gpushare.sim.openb import read_nodes, read_pods
from gpushare.sim.progress import PlainProgress

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NAMES = ("default", "gpushare40", "gpushare100")
POLICIES = ("bestfit", "fgd", "gpushare")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--trace", action="append")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--load", type=float, default=LOAD, help="demand, of the trace's GPUs")
    parser.add_argument("--volume", type=float, default=VOLUME, help="stream, in capacities")
    defaults = Settings()
    parser.add_argument("--provision-s", type=float, default=defaults.provision_s)
    parser.add_argument("--unneeded-s", type=float, default=defaults.unneeded_s)
    parser.add_argument("--delay-after-add-s", type=float, default=defaults.delay_after_add_s)
    parser.add_argument("--headroom", type=float, default=defaults.headroom)
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "autoscale")
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of the openb csv files")
    args = parser.parse_args()
    if not args.traces.exists():
        print(f"error: the openb traces are not at {args.traces}; put ../shared beside the project")
        return 2
    try:
        settings = Settings(
            provision_s=args.provision_s,
            unneeded_s=args.unneeded_s,
            delay_after_add_s=args.delay_after_add_s,
            headroom=args.headroom,
        )
    except ValueError as err:
        print(f"error: {err}")
        return 2
    policies = args.policy or list(POLICIES)
    nodes = read_nodes(args.traces / "openb_node_list_gpu_node.csv")
    names = args.trace or list(NAMES)
    progress = PlainProgress(
        len(names) * len(policies) * args.seeds, say=lambda line: print(line, flush=True)
    )
    tables: dict[str, list[str]] = {}
    notes: list[str] = []
    for name in names:
        pods = read_pods(args.traces / f"openb_pod_list_{name}.csv")
        print(f"{name}: {len(policies)} policies x {args.seeds} seeds", flush=True)
        started = time.perf_counter()
        experiment = autoscalereport.run_autoscale_experiment(
            name,
            nodes,
            pods,
            policies,
            list(range(args.seeds)),
            settings=settings,
            load=args.load,
            volume=args.volume,
            workers=args.workers,
            progress=progress,
        )
        written = autoscalereport.write(experiment, args.out / name)
        print(f"{name}: {time.perf_counter() - started:.0f} s; {', '.join(map(str, written))}")
        for reference in ("fgd", "bestfit"):
            if reference in policies:
                tables.setdefault(reference, []).extend(autoscalereport.rows(experiment, reference))
        notes += autoscalereport.notes(experiment)
    for reference, lines in tables.items():
        demand = f"{100 * args.load:.0f} % of the trace's GPUs"
        print(f"\nautoscaled, demand {demand}, {args.seeds} seeds")
        print("\n".join(autoscalereport.header(reference)))
        print("\n".join(lines))
    print()
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
