"""DRA mode's packing beside stock first-fit and device-plugin mode, on the same replay.

The openb trace's arrival stream (``sim.gpumem.stream``: one fixed gpu-mem per pod, one try
each, no departures) is placed on the same cluster in each mode of ``sim.draplacing``:
``first-fit`` (the stock allocator's device order, kube-scheduler's default node scores),
``first-fit-order`` (the same devices, nodes in the seed's order), ``dra`` (gpushare's DRA
allocator, ``core.dra.allocate``) and ``device-plugin`` (the extender's core). It prints, per
mode, mean +- sd over the seeds of: GPUs holding a share at 80 % arrived (before pods fail:
fewer is tighter packing), and where the cluster is full (100 % arrived) the GPUs holding a
share, unallocated GPU memory % and fragmented memory % (free memory on GPUs that hold a
share); then the paired differences per seed (DRA - first-fit, DRA - first-fit-order,
DRA - device plugin) with their paired sd.

    python benchmarks/dra_packing.py [--seeds 5] [--trace default] [--nodes N] [--policy P]
                                     [--traces DIR]

The traces are read from ``../shared/traces/openb`` beside the project; without them the
benchmark says so and exits with 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces" / "openb"
NODE_LIST = "openb_node_list_gpu_node.csv"

from gpushare.sim import draplacing, gpumem  # noqa: E402
from gpushare.sim.openb import read_nodes, read_pods  # noqa: E402

METRICS = (
    ("GPUs used @80%", "gpus_used_early", 0),
    ("GPUs used @100%", "gpus_used", 0),
    ("unallocated % @100%", "unallocated", 2),
    ("fragmented % @100%", "fragmented", 2),
    ("pods failed", "failed", 0),
)
PAIRS = (("dra", "first-fit"), ("dra", "first-fit-order"), ("dra", "device-plugin"))


def _spread(values: Sequence[float], digits: int, *, signed: bool = False) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    sign = "+" if signed else ""
    return f"{mean:{sign}.{digits}f} +- {sd:.{digits}f}"


def table(runs: dict[str, list[draplacing.ModeRun]]) -> str:
    """The markdown table: per mode and metric, then the paired differences."""
    modes = list(runs)
    lines = ["| metric | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for label, attr, digits in METRICS:
        cells = [_spread([float(getattr(r, attr)) for r in runs[m]], digits) for m in modes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    pairs = [p for p in PAIRS if p[0] in runs and p[1] in runs]
    if not pairs:
        return "\n".join(lines)
    lines += ["", "| paired difference | " + " | ".join(f"{a} - {b}" for a, b in pairs) + " |"]
    lines.append("|---" * (len(pairs) + 1) + "|")
    for label, attr, digits in METRICS:
        cells = []
        for a, b in pairs:
            diffs = [
                float(getattr(x, attr)) - float(getattr(y, attr))
                for x, y in zip(runs[a], runs[b], strict=True)
            ]
            cells.append(_spread(diffs, digits, signed=True))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of the openb csv files")
    parser.add_argument("--nodes", type=int, default=0, help="the first N nodes (0: all)")
    parser.add_argument("--policy", default="gpushare", help="node policy of dra/device-plugin")
    parser.add_argument("--modes", nargs="*", default=list(draplacing.MODES))
    args = parser.parse_args(argv)
    traces: Path = args.traces
    pods_file = traces / f"openb_pod_list_{args.trace}.csv"
    if not (traces / NODE_LIST).exists() or not pods_file.exists():
        print(
            f"the openb traces are not at {traces} (--traces): nothing to measure", file=sys.stderr
        )
        return 2
    nodes = read_nodes(traces / NODE_LIST)
    if args.nodes:
        nodes = nodes[: args.nodes]
    pods = read_pods(pods_file)
    runs: dict[str, list[draplacing.ModeRun]] = {m: [] for m in args.modes}
    for seed in range(args.seeds):
        stream = gpumem.stream(pods, nodes, seed=seed)
        for mode in args.modes:
            run = draplacing.run_mode(mode, nodes, stream, seed=seed, policy=args.policy)
            runs[mode].append(run)
            print(
                f"seed {seed} {mode}: GPUs used {run.gpus_used_early} @80%, {run.gpus_used} "
                f"@100%; unallocated {run.unallocated:.2f}%, fragmented {run.fragmented:.2f}%, "
                f"failed {run.failed}",
                file=sys.stderr,
                flush=True,
            )
    print(
        f"trace {args.trace}, {len(nodes)} nodes, {args.seeds} seeds, policy {args.policy} "
        "(dra and device-plugin)"
    )
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
