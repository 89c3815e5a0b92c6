"""Several policies over several seeds of the autoscaling protocol (``sim.autoscaling``), and its
report.

The table gives per policy the node-hours and GPU-hours bought, the share of those GPU-hours the
pods held, the GPU demand that waited, how many pods waited and how long, the most nodes at once,
and each policy's node-hours and GPU-hours less a reference policy's, paired by seed (the same
seed gives every policy the same pods at the same times and the same slot order). The picture
shows the nodes bought over time, one seed, every policy.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from gpushare.sim.autoscaling import LOAD, VOLUME, AutoscaleRun, Settings, run_autoscaling
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.report import spread
from gpushare.sim.seeds import PairedRuns, run_all


@dataclass
class AutoscaleExperiment(PairedRuns[AutoscaleRun]):
    """Every policy on every seed of one trace, autoscaled."""

    trace: str
    settings: Settings
    load: float
    volume: float
    seeds: list[int]
    policies: list[str]
    runs: list[AutoscaleRun]


def run_autoscale_experiment(
    trace: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    settings: Settings | None = None,
    load: float = LOAD,
    volume: float = VOLUME,
    workers: int = 1,
    progress: Callable[[AutoscaleRun], None] | None = None,
) -> AutoscaleExperiment:
    """Each (policy, seed) run is independent: in a process pool when ``workers`` > 1."""
    settings = settings or Settings()
    one = partial(run_autoscaling, nodes, pods, settings=settings, load=load, volume=volume)
    runs = run_all(one, policies, seeds, workers=workers, progress=progress)
    return AutoscaleExperiment(trace, settings, load, volume, list(seeds), list(policies), runs)


COLUMNS = (
    "trace",
    "policy",
    "node-hours",
    "GPU-hours bought",
    "held, % of bought",
    "most nodes",
    "waited, GPU-hours",
    "pods that waited",
    "their mean wait, min",
    "node-hours minus {ref}, paired",
    "GPU-hours minus {ref}, paired",
)


def header(reference: str) -> list[str]:
    """The markdown header of ``rows``' table."""
    names = [c.format(ref=reference) for c in COLUMNS]
    return ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def rows(experiment: AutoscaleExperiment, reference: str) -> list[str]:
    """One markdown row per policy: mean +- sd over seeds, and paired differences."""
    out: list[str] = []
    for policy in experiment.policies:
        used = [r.used_pct for r in experiment.of(policy)]
        cells = [
            experiment.trace,
            policy,
            spread(experiment.values(policy, "node_hours"), digits=1),
            spread(experiment.values(policy, "gpu_hours"), digits=0),
            spread(used, digits=1),
            spread(experiment.values(policy, "peak_nodes"), digits=0),
            spread(experiment.values(policy, "waited_gpu_hours"), digits=1),
            spread(experiment.values(policy, "waited_pods"), digits=0),
            spread(experiment.values(policy, "mean_wait_min"), digits=2),
        ]
        if policy == reference:
            cells += ["", ""]
        else:
            cells += [
                spread(experiment.paired(policy, reference, "node_hours"), signed=True, digits=1),
                spread(experiment.paired(policy, reference, "gpu_hours"), signed=True, digits=0),
            ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def notes(experiment: AutoscaleExperiment) -> list[str]:
    """What the table leaves out: span, removals, groups at their maximum, pods no group fits."""
    lines = []
    for policy in experiment.policies:
        runs = experiment.of(policy)
        span = statistics.fmean(r.span_h for r in runs) if runs else 0.0
        lines.append(
            f"- {experiment.trace} {policy}: span {span:.2f} h; scale-ups "
            f"{spread([r.scale_ups for r in runs], digits=0)}, nodes added "
            f"{spread([r.nodes_added for r in runs], digits=0)}, removed "
            f"{spread([r.nodes_removed for r in runs], digits=0)}; loops with a group at its "
            f"maximum {sum(r.refused_at_max for r in runs)}; pods no group fits "
            f"{sum(r.unplaceable for r in runs)}"
        )
    return lines


def write(experiment: AutoscaleExperiment, out: Path, *, plot: bool = True) -> list[Path]:
    """``autoscale.json`` (every run) and ``nodes.png`` (nodes over time, first seed)."""
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(experiment)
    path = out / "autoscale.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    written = [path]
    if plot and experiment.runs:
        written.append(plot_nodes(experiment, out / "nodes.png"))
    return written


def plot_nodes(experiment: AutoscaleExperiment, path: Path, seed: int | None = None) -> Path:
    """Nodes bought over time, one line per policy, on one seed (the first by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = experiment.seeds[0] if seed is None else seed
    fig, axis = plt.subplots(figsize=(9, 4.8))
    for policy in experiment.policies:
        for run in experiment.of(policy):
            if run.seed != chosen or not run.series:
                continue
            hours = [p[0] for p in run.series]
            nodes = [p[1] for p in run.series]
            axis.step(
                hours,
                nodes,
                where="post",
                lw=1.6,
                label=f"{policy}: {run.node_hours:.0f} node-hours, most {run.peak_nodes}",
            )
    s = experiment.settings
    axis.set_xlabel("hours since the first pod")
    axis.set_ylabel("nodes bought (provisioning or ready)")
    axis.set_ylim(bottom=0)
    axis.set_xlim(left=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=9)
    axis.set_title(
        f"{experiment.trace} trace, seed {chosen}, autoscaled from zero: nodes ready "
        f"{s.provision_s / 60:.0f} min after the scale-up,\nremoved after "
        f"{s.unneeded_s / 60:.0f} min empty, demand {100 * experiment.load:.0f} % of the "
        "trace cluster's GPUs",
        fontsize=10,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
