"""Unallocated GPU % per policy on the built-in stress workloads (``sim.synthetic.STRESS``).

The openb traces hold one mix of pods; a policy tuned on them may not be robust to another. Each
stress workload changes one property of the built-in openb-like workload (many multi-GPU pods,
pods restricted to one or two GPU models, CPU-heavy pods; ``mixed``: all three), on the
built-in 90-node cluster, with the paper's protocol: the pod list (generator seed 0) is
shuffled and inflated per seed to 130 % of GPU capacity. The table is policy_table's: mean +- sd
at 100 % and 130 % arrived, and each policy minus FGD paired by seed, at both points. Every
number also lands in ``bench-out/stress/<workload>/report.json`` with the plots.

    python benchmarks/stress_table.py [--seeds 10] [--workers 2] [--workload multigpu ...]

``--topology LAYOUT`` (a name of ``core.model.topology.LAYOUTS``, e.g. ``nvlink-islands``) prints a
second table instead: the nodes take that layout, and each policy runs twice on the same
seeds, placing multi-GPU pods in packing order and topology-aware. It gives unallocated % at
100 % arrived for both, their difference paired by seed (the packing cost of following the
topology), and the share of multi-GPU pods that got a best-connected set (``sim.links``).
``--memory`` runs that in the memory-unit mode, the extender's own core in GiB
(``sim.gpumem``), where a GPU is shared by memory and the choice can cost packing; the
milli-GPU mode takes whole GPUs for such pods, where it cannot.

    python benchmarks/stress_table.py --workload multigpu --topology nvlink-islands [--memory]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpushare.core.model.topology import LAYOUTS
from gpushare.sim import gpumem, report, synthetic
from gpushare.sim.experiment import Experiment, run_experiment
from gpushare.sim.openb import TraceNode

POLICIES = ("bestfit", "fgd", "gpushare")
"""policy_table's policies: the paper's BestFit baseline, FGD and gpushare."""
PAIRED = (100, 130)
"""Arrived % at which each policy's difference to FGD is shown."""


def table(
    workloads: Sequence[str],
    seeds: int,
    *,
    workers: int = 1,
    out: Path | None = None,
    cluster: list[TraceNode] | None = None,
    say: Callable[[str], None] = lambda text: print(text, end="", flush=True),
) -> list[str]:
    """The markdown table (header and rows) over the named workloads; ``say`` shows progress.

    ``cluster`` replaces the built-in nodes (a smaller one for a quick look); with ``out`` each
    workload's report is written under ``out/<workload>``.
    """
    nodes = cluster if cluster is not None else synthetic.nodes()
    rows = report.versus_header(published=False, reference="fgd", paired=PAIRED)
    for name in workloads:
        pods = synthetic.pods(nodes, seed=0, mix=synthetic.workload(name))
        jobs = (len(POLICIES) + 1) * seeds
        say(f"{name}: {len(pods)} pods, {jobs} runs ")
        started = time.perf_counter()
        experiment = run_experiment(
            name,
            nodes,
            pods,
            POLICIES,
            list(range(seeds)),
            workers=workers,
            progress=lambda result: say("."),
        )
        if out is not None:
            report.write(experiment, out / name)
        say(f" {time.perf_counter() - started:.0f} s\n")
        rows += report.versus_rows(experiment, published=False, paired=PAIRED)
    return rows


MEMORY_POLICIES = ("binpack", "fgd", "gpushare")
"""The memory mode's node policies compared with ``--memory`` (``sim.gpumem``)."""


def topology_table(
    workloads: Sequence[str],
    seeds: int,
    layout: str,
    *,
    memory: bool = False,
    workers: int = 1,
    cluster: list[TraceNode] | None = None,
    say: Callable[[str], None] = lambda text: print(text, end="", flush=True),
) -> list[str]:
    """Markdown rows: per workload and policy, packing order against topology-aware."""
    nodes = cluster if cluster is not None else synthetic.nodes()
    policies = MEMORY_POLICIES if memory else POLICIES
    settings = gpumem.MemorySettings() if memory else None
    rows = [
        "| workload | policy | unallocated % at 100 %, packing order | topology-aware | "
        "aware - packing, paired | best-connected, packing order | topology-aware |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in workloads:
        pods = synthetic.pods(nodes, seed=0, mix=synthetic.workload(name))
        say(f"{name}: {len(pods)} pods, {2 * len(policies) * seeds} runs ")
        started = time.perf_counter()
        runs: dict[bool, Experiment] = {}
        for aware in (False, True):
            runs[aware] = run_experiment(
                name,
                nodes,
                pods,
                policies,
                list(range(seeds)),
                workers=workers,
                offline=False,
                lp_bound=False,
                memory=settings,
                topology=layout,
                aware=aware,
                progress=lambda result: say("."),
            )
        say(f" {time.perf_counter() - started:.0f} s\n")
        for policy in policies:
            cells = [report.spread(runs[aware].values(policy, 100)) for aware in (False, True)]
            before = {r.seed: r.points[100] for r in runs[False].of(policy)}
            paired = [r.points[100] - before[r.seed] for r in runs[True].of(policy)]
            shares = [_connected(runs[aware], policy) for aware in (False, True)]
            rows.append(
                f"| {name} | {policy} | {cells[0]} | {cells[1]} | "
                f"{report.spread(paired, signed=True)} | {shares[0]} | {shares[1]} |"
            )
    return rows


def _connected(experiment: Experiment, policy: str) -> str:
    """Best-connected multi-GPU pods over all seeds, as a share and a count."""
    pods = sum(r.connected[0] for r in experiment.of(policy))
    best = sum(r.connected[1] for r in experiment.of(policy))
    return f"{100 * best / pods:.1f} % ({best}/{pods})" if pods else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--workload", action="append", choices=synthetic.STRESS)
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "stress")
    parser.add_argument(
        "--topology",
        choices=sorted(LAYOUTS),
        help="give the nodes this GPU layout; compare packing order with topology-aware",
    )
    parser.add_argument(
        "--memory", action="store_true", help="with --topology: the memory-unit mode (GiB)"
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least one seed is needed")
    if args.memory and not args.topology:
        parser.error("--memory compares topologies: give --topology too")
    if args.topology:
        workloads = args.workload or synthetic.STRESS
        rows = topology_table(
            workloads, args.seeds, args.topology, memory=args.memory, workers=args.workers
        )
        mode = "memory-unit mode (GiB)" if args.memory else "milli-GPU mode"
        print(f"\nlayout {args.topology}, {mode}, {report.describe(args.seeds)} (built-in cluster)")
        print("\n".join(rows))
        return 0
    rows = table(args.workload or synthetic.STRESS, args.seeds, workers=args.workers, out=args.out)
    print(f"\nunallocated GPU %, mean +- sd over {args.seeds} seeds (built-in cluster)")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
