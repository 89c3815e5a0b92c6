"""Unallocated GPU % per policy on the built-in stress workloads (``sim.synthetic.STRESS``).

The openb traces hold one mix of pods; a policy tuned on them may not be robust to another. Each
stress workload changes one property of the built-in openb-like workload (many multi-GPU pods,
pods restricted to one or two GPU models, CPU-heavy pods; ``mixed``: all three), on the
built-in 90-node cluster, with the paper's protocol: the pod list (generator seed 0) is
shuffled and inflated per seed to 130 % of GPU capacity. The table is policy_table's: mean +- sd
at 100 % and 130 % arrived, and each policy minus FGD paired by seed, at both points. Every
number also lands in ``bench-out/stress/<workload>/report.json`` with the plots.

    python benchmarks/stress_table.py [--seeds 10] [--workers 2] [--workload multigpu ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpushare.sim import report, synthetic
from gpushare.sim.experiment import run_experiment
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--workload", action="append", choices=synthetic.STRESS)
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "stress")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least one seed is needed")
    rows = table(args.workload or synthetic.STRESS, args.seeds, workers=args.workers, out=args.out)
    print(f"\nunallocated GPU %, mean +- sd over {args.seeds} seeds (built-in cluster)")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
