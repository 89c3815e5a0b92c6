"""Several policies over several seeds of the churn protocol (``sim.churn``), and its report.

The table gives per policy the time-weighted unallocated GPU (GPUs and % of capacity), the GPU
demand that waited (GPU-hours), how many pods waited and how long, and each policy's difference
to the reference policies paired by seed (the same seed gives every policy the same stream and
node order). The plot shows unallocated and waiting GPUs over the window.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from gpushare.sim.churn import LOAD, VOLUME, ChurnRun, run_churn
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.report import spread
from gpushare.sim.seeds import PairedRuns, run_all


@dataclass
class ChurnExperiment(PairedRuns[ChurnRun]):
    """Every policy on every seed of one trace under churn."""

    trace: str
    nodes: int
    gpus: int
    load: float
    volume: float
    seeds: list[int]
    policies: list[str]
    runs: list[ChurnRun]


def run_churn_experiment(
    trace: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    load: float = LOAD,
    volume: float = VOLUME,
    workers: int = 1,
    progress: Callable[[ChurnRun], None] | None = None,
) -> ChurnExperiment:
    """Each (policy, seed) run is independent: in a process pool when ``workers`` > 1."""
    one = partial(run_churn, nodes, pods, load=load, volume=volume)
    runs = run_all(one, policies, seeds, workers=workers, progress=progress)
    gpus = sum(n.gpus for n in nodes)
    return ChurnExperiment(trace, len(nodes), gpus, load, volume, list(seeds), list(policies), runs)


HEADER = (
    "| trace | policy | unallocated GPUs (% of capacity) | waited, GPU-hours | pods that waited "
    "| their mean wait, min | longest wait, min | unallocated minus {ref}, paired, GPUs "
    "| waited minus {ref}, paired, GPU-hours |"
)


def header(reference: str) -> list[str]:
    """The markdown header of ``rows``' table."""
    return [HEADER.format(ref=reference.upper()), "|" + "---|" * 9]


def rows(experiment: ChurnExperiment, reference: str) -> list[str]:
    """One markdown row per policy: mean +- sd over seeds, and paired differences."""
    out: list[str] = []
    for policy in experiment.policies:
        gpus = experiment.values(policy, "unallocated_gpus")
        pct = statistics.fmean(experiment.values(policy, "unallocated_pct"))
        waits = [60.0 * w for w in experiment.values(policy, "mean_wait_h")]
        longest = [60.0 * w for w in experiment.values(policy, "longest_wait_h")]
        cells = [
            experiment.trace,
            policy,
            f"{spread(gpus)} ({pct:.2f} %)",
            spread(experiment.values(policy, "waited_gpu_hours")),
            spread(experiment.values(policy, "waited_pods"), digits=0),
            spread(waits, digits=1),
            spread(longest, digits=1),
        ]
        if policy == reference:
            cells += ["", ""]
        else:
            cells += [
                spread(experiment.paired(policy, reference, "unallocated_gpus"), signed=True),
                spread(experiment.paired(policy, reference, "waited_gpu_hours"), signed=True),
            ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def write(experiment: ChurnExperiment, out: Path, *, plot: bool = True) -> list[Path]:
    """``churn.json`` (every run) and ``churn.png`` (the plot) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(experiment)
    path = out / "churn.json"
    path.write_text(json.dumps(data, indent=1, default=_finite) + "\n")
    written = [path]
    if plot:
        written.append(_plot(experiment, out / "churn.png"))
    return written


def _finite(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def _plot(experiment: ChurnExperiment, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True)
    spans = [r.series[-1][0] for r in experiment.runs if r.series]
    hours = min(spans) if spans else 1.0
    scale, unit = (60.0, "minutes") if hours < 2.0 else (1.0, "hours")
    end = hours * scale
    grid = np.linspace(0.0, end, 100)
    cycle = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    highest = [1.0, 1.0]
    for policy in experiment.policies:
        color = next(cycle)
        runs = [r for r in experiment.of(policy) if r.series]
        for axis, column in ((top, 1), (bottom, 2)):
            curves = np.array(
                [
                    np.interp(grid, [scale * p[0] for p in r.series], [p[column] for p in r.series])
                    for r in runs
                ]
            )
            if not len(curves):
                continue
            mean = curves.mean(axis=0)
            axis.plot(grid, mean, color=color, lw=1.8, label=f"{policy} (mean)")
            if len(curves) > 1:
                axis.fill_between(
                    grid, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.18, lw=0
                )
            highest[column - 1] = max(highest[column - 1], float(curves.max()))
    seeds = len(experiment.seeds)
    band = f"; band: lowest to highest of {seeds} seeds" if seeds > 1 else "; one seed"
    for axis, most, what in (
        (top, highest[0], "idle GPUs (lower is better)"),
        (bottom, highest[1], "GPUs asked by waiting pods"),
    ):
        axis.set_ylim(0.0, most * 1.1)
        axis.set_ylabel(what)
        axis.grid(alpha=0.3)
        share = axis.secondary_yaxis(
            "right",
            functions=(
                lambda g: 100.0 * g / experiment.gpus,
                lambda p: p * experiment.gpus / 100.0,
            ),
        )
        share.set_ylabel("% of all GPUs")
    top.set_xlim(0.0, end)
    top.legend(loc="lower right", fontsize=9)
    bottom.set_xlabel(f"{unit} since the pods asked for {100 * experiment.load:.0f} % of the GPUs")
    load = f"{100 * experiment.load:.0f} %"
    top.set_title(
        f"{experiment.trace} trace on {experiment.gpus} GPUs: new pods keep {load} of the GPUs "
        f"asked for,\neach pod leaves after its own run time{band}",
        fontsize=10,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
