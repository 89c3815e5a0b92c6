"""The simulator's report: a table, a JSON file with every number, and pictures.

- ``table.md``: unallocated GPU % at 90/95/100/110/130 % arrived, mean +- sd over seeds (the
  value alone when there is one seed: n=1 has no spread), the LP lower bound, the published
  values, and why pods failed;
- ``report.json``: every point, curve, fragmentation sample and failure count;
- ``curve.png``: unallocated % against arrived % from 90 to 130 %, one line per policy (mean
  over seeds) in a band from the lowest to the highest seed, the published values as points,
  and the LP lower bound (with no scipy: the offline first-fit-decreasing packing, which is
  no bound);
- ``fragmentation.png``: the fragmented share of capacity as pods arrive, one line per policy
  (mean over seeds) in a band from the lowest to the highest seed.

Both plots read at a glance: y from 0, % of capacity on the left and GPUs on the right, titles
in plain words.

``write`` replaces what the folder holds; the CLI refuses a folder that is not empty unless
told ``--force``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gpushare.sim.experiment import CURVE_POINTS, OFFLINE, POINTS, Experiment

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes

PUBLISHED = {
    "default": {"bestfit": 7.14, "fgd": 4.77},
    "gpushare40": {"bestfit": 8.56, "fgd": 6.04},
    "gpushare60": {"bestfit": 10.94, "fgd": 8.75},
    "gpushare80": {"bestfit": 13.34, "fgd": 10.92},
    "gpushare100": {"bestfit": 15.38, "fgd": 13.36},
}
"""The FGD artifact's cached results at 100 % arrived (BENCHMARKS.md)."""

PUBLISHED_130 = {"default": {"bestfit": 6.92, "fgd": 4.61}}
"""The same at 130 % arrived, where BENCHMARKS.md gives them (the default trace)."""

LP_LABEL = "LP lower bound"
"""The bound's row in the table."""


def published_points(trace: str) -> list[tuple[str, int, float]]:
    """(policy, arrived %, value) of every published value for ``trace``."""
    points = [(p, 100, v) for p, v in PUBLISHED.get(trace, {}).items()]
    return points + [(p, 130, v) for p, v in PUBLISHED_130.get(trace, {}).items()]


def spread(values: Sequence[float], *, signed: bool = False, digits: int = 2) -> str:
    """``mean +- sd`` over seeds; one seed has no spread, so its value stands alone."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    sign = "+" if signed else ""
    mean = f"{statistics.fmean(finite):{sign}.{digits}f}"
    if len(finite) == 1:
        return mean
    return f"{mean} +- {statistics.stdev(finite):.{digits}f}"


def describe(seeds: int) -> str:
    """What a table cell is, for titles."""
    if seeds == 1:
        return "one seed (n=1: values, no spread)"
    return f"mean +- sd over {seeds} seeds"


def table(experiment: Experiment) -> list[list[str]]:
    """Rows: policy, then mean +- sd at each point, then the published value at 100 %.

    The LP lower bound, when computed, is the last row.
    """
    known = PUBLISHED.get(experiment.trace, {})
    rows = [["policy", *[f"{p}%" for p in POINTS], "published@100"]]
    for policy in experiment.policies:
        row = [policy]
        for point in POINTS:
            row.append(spread(experiment.values(policy, point)))
        value = known.get(policy)
        row.append(f"{value:.2f}" if value is not None else "")
        rows.append(row)
    if experiment.bound:
        rows.append([LP_LABEL, *[spread(experiment.bound[p]) for p in POINTS], ""])
    return rows


def versus_header(*, published: bool, reference: str, paired: tuple[int, ...]) -> list[str]:
    """The markdown header of ``versus_rows``' table (two lines)."""
    columns = ["trace", "policy", "at 100% arrived", "at 130% arrived"]
    if published:
        columns.append("published at 100%")
    columns += [f"minus {reference.upper()} at {p}%, paired by seed" for p in paired]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def versus_rows(
    experiment: Experiment,
    *,
    published: bool,
    reference: str = "fgd",
    paired: tuple[int, ...] = (100,),
) -> list[str]:
    """Markdown rows: each policy's mean +- sd at 100 and 130 % arrived, beside ``reference``.

    The difference to ``reference`` is paired by seed (same stream, same node order), so it
    shows an effect that the spread between seeds would hide: below zero and beyond its sd beats
    the reference. The benchmarks' tables (openb and stress workloads) share this layout.
    """
    known = PUBLISHED.get(experiment.trace, {})
    rows = []
    for policy in experiment.policies:
        cells = [
            experiment.trace,
            policy,
            spread(experiment.values(policy, 100)),
            spread(experiment.values(policy, 130)),
        ]
        if published:
            value = known.get(policy)
            cells.append("" if value is None else f"{value:.2f}")
        for point in paired:
            versus = ""
            if reference in experiment.policies and policy not in (reference, OFFLINE):
                diffs = experiment.differences(policy, reference, point)
                versus = spread(diffs, signed=True) if diffs else "-"
            cells.append(versus)
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def failures(experiment: Experiment) -> dict[str, dict[str, float]]:
    """Mean failed pods per seed, by reason, per policy."""
    out: dict[str, dict[str, float]] = {}
    for policy in experiment.policies:
        runs = experiment.of(policy)
        reasons: dict[str, float] = {}
        for run in runs:
            for reason, count in run.failed.items():
                reasons[reason] = reasons.get(reason, 0.0) + count / len(runs)
        if reasons:
            out[policy] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
    return out


def markdown(experiment: Experiment) -> str:
    """``table.md``: the table, what its cells are, the references, and why pods failed."""
    rows = table(experiment)
    lines = [
        f"# {experiment.trace}: {experiment.nodes} nodes, {experiment.gpus} GPUs",
        "",
        f"Unallocated GPU % (lower is better) at arrived %, {describe(len(experiment.seeds))}; "
        f"seeds {', '.join(str(s) for s in experiment.seeds)}.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "|" + "---|" * len(rows[0]),
        *("| " + " | ".join(row) + " |" for row in rows[1:]),
        "",
    ]
    if experiment.bound:
        lines.append(
            f"- {LP_LABEL}: no placement of the pods that arrived can leave less unallocated "
            "(a linear program over GPU shares that ignores CPU, memory, models and nodes)."
        )
    if OFFLINE in experiment.policies:
        lines.append(
            f"- {OFFLINE}: the arrived pods packed offline by first-fit-decreasing; "
            "not a bound: online policies can do better."
        )
    if any(PUBLISHED.get(experiment.trace, {})):
        lines.append("- published@100: the FGD artifact's 10-seed mean at 100 % arrived.")
    reasons = failures(experiment)
    if reasons:
        lines += ["", "Failed pods per seed (mean), by the first requirement no node met:", ""]
        for policy, counts in reasons.items():
            text = ", ".join(f"{reason} {n:.0f}" for reason, n in counts.items())
            lines.append(f"- {policy}: {text}")
    return "\n".join(lines) + "\n"


def write(experiment: Experiment, out: Path, *, plots: bool = True) -> list[Path]:
    """Write table.md, report.json (and the pictures); returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        policy: {str(p): _summary(experiment.values(policy, p)) for p in POINTS}
        for policy in experiment.policies
    }
    document = {
        "trace": experiment.trace,
        "nodes": experiment.nodes,
        "gpus": experiment.gpus,
        "tune": experiment.tune,
        "seeds": experiment.seeds,
        "policies": experiment.policies,
        "points": list(POINTS),
        "summary": summary,
        "lp_bound": {str(p): _summary(v) for p, v in experiment.bound.items()},
        "lp_bound_per_seed": {str(p): v for p, v in experiment.bound.items()},
        "published_at_100": PUBLISHED.get(experiment.trace, {}),
        "published_at_130": PUBLISHED_130.get(experiment.trace, {}),
        "failed_by_reason": failures(experiment),
        "curve_grid_step_percent": 0.5,
        "runs": [asdict(r) for r in experiment.results],
    }
    files = [out / "table.md", out / "report.json"]
    files[0].write_text(markdown(experiment))
    files[1].write_text(json.dumps(_finite(document), indent=1) + "\n")
    if plots:
        files += _plots(experiment, out)
    return files


def _summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, sd (null for one value: no spread) and n of the finite values."""
    finite = [v for v in values if not math.isnan(v)]
    return {
        "mean": statistics.fmean(finite) if finite else None,
        "sd": statistics.stdev(finite) if len(finite) > 1 else None,
        "n": len(finite),
    }


def _finite(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


LOW, HIGH = 90, 130
"""The arrived % the curve shows: every policy but Random keeps up until about 90 %."""


def _plots(experiment: Experiment, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    grid = [k * 0.5 for k in range(CURVE_POINTS)]
    shown = [k for k, x in enumerate(grid) if LOW <= x <= HIGH]
    xs = [grid[k] for k in shown]
    seeds = len(experiment.seeds)
    fig, ax = plt.subplots(figsize=(9, 5.2))
    seen: list[float] = []
    colors: dict[str, str] = {}
    cycle = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for policy in experiment.policies:
        if policy == OFFLINE:
            continue
        curves = [r.curve for r in experiment.of(policy)]
        mean = [_mean([c[k] for c in curves]) for k in shown]
        low = [_least([c[k] for c in curves]) for k in shown]
        high = [_most([c[k] for c in curves]) for k in shown]
        color = colors[policy] = next(cycle)
        ax.plot(xs, mean, color=color, lw=1.8, label=policy)
        if seeds > 1:
            ax.fill_between(xs, low, high, color=color, alpha=0.18, lw=0)
        seen += low + high
    if experiment.bound:
        values = [experiment.bound[p] for p in POINTS]
        ax.plot(
            POINTS,
            [statistics.fmean(v) for v in values],
            "k--x",
            drawstyle="steps-pre",  # the bound only falls as pods arrive: it holds leftwards
            label=f"{LP_LABEL}: no policy\ncan go below (solved\nat the marked points)",
        )
        if seeds > 1:
            ax.fill_between(
                POINTS,
                [min(v) for v in values],
                [max(v) for v in values],
                step="pre",
                color="k",
                alpha=0.1,
                lw=0,
            )
        seen += [x for v in values for x in v]
    elif OFFLINE in experiment.policies:
        means = [experiment.summary(OFFLINE, p)[0] for p in POINTS]
        ax.plot(
            POINTS, means, ":o", color="0.45", label="offline first-fit-decreasing\n(not a bound)"
        )
        seen += means
    marks = [(p, x, v) for p, x, v in published_points(experiment.trace) if p in colors]
    for policy, point, value in marks:
        ax.plot([point], [value], "D", ms=8, mfc=colors[policy], mec="k", ls="none")
        seen.append(value)
    handles, labels = ax.get_legend_handles_labels()
    if marks:
        handles.append(Line2D([], [], marker="D", ms=8, mfc="0.8", mec="k", ls="none"))
        labels.append("published (FGD artifact,\n10-seed mean; colour: policy)")
    finite = [v for v in seen if not math.isnan(v)]
    _from_zero(ax, max(finite) if finite else 1.0, experiment)
    ax.set_xlim(LOW - 1, HIGH + 1)
    ax.set_xticks(range(LOW, HIGH + 1, 5))
    ax.set_xlabel(f"pods arrived: their {_asked(experiment)}, % of capacity")
    ax.set_ylabel(f"{_what(experiment)} left unallocated, % (lower is better)")
    what = "one seed" if seeds == 1 else f"lines: mean of {seeds} seeds"
    ax.set_title(
        f"{experiment.trace}: {experiment.nodes} nodes, {experiment.gpus} GPUs; how much stays "
        f"unallocated as pods arrive ({what})",
        fontsize=11,
    )
    _legend(ax, handles, labels, seeds)
    curve = out / "curve.png"
    fig.savefig(curve, dpi=110, bbox_inches="tight")
    plt.close(fig)

    if not any(r.fragmentation for r in experiment.results):
        return [curve]  # the memory mode does not sample fragmentation
    fig, ax = plt.subplots(figsize=(9, 5.2))
    highest = 1.0
    fine = [LOW - 1 + k * 0.5 for k in range(2 * (HIGH - LOW + 2) + 1)]
    for policy in experiment.policies:
        runs = [_along(r.fragmentation, fine) for r in experiment.of(policy) if r.fragmentation]
        if not runs:
            continue
        mean = [_mean([run[k] for run in runs]) for k in range(len(fine))]
        low = [_least([run[k] for run in runs]) for k in range(len(fine))]
        high = [_most([run[k] for run in runs]) for k in range(len(fine))]
        color = colors.get(policy)
        ax.plot(fine, mean, "-", lw=1.8, color=color, label=policy)
        if len(runs) > 1:
            ax.fill_between(fine, low, high, color=color, alpha=0.18, lw=0)
        highest = max(highest, *(v for v in high if not math.isnan(v)))
    handles, labels = ax.get_legend_handles_labels()
    _from_zero(ax, highest, experiment)
    ax.set_xlim(LOW - 1, HIGH + 1)
    ax.set_xticks(range(LOW, HIGH + 1, 5))
    ax.set_xlabel(f"pods arrived: their {_asked(experiment)}, % of capacity")
    ax.set_ylabel("idle GPU where the trace's usual pods\nno longer fit, % (lower is better)")
    what = "one seed" if seeds == 1 else f"lines: mean of {seeds} seeds"
    ax.set_title(
        f"{experiment.trace}: idle GPU stranded where the usual pods no longer fit ({what})",
        fontsize=10,
    )
    _legend(ax, handles, labels, seeds)
    frag = out / "fragmentation.png"
    fig.savefig(frag, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [curve, frag]


def _along(samples: Sequence[tuple[float, float]], xs: Sequence[float]) -> list[float]:
    """A run's fragmentation samples read at ``xs`` arrived %, straight between samples
    (seeds sample at slightly different arrived %: each samples when a pod takes it past a
    mark); NaN outside what the run sampled."""
    out: list[float] = []
    k = 0
    for x in xs:
        while k + 1 < len(samples) and samples[k + 1][0] < x:
            k += 1
        if not samples or x < samples[0][0] or x > samples[-1][0]:
            out.append(math.nan)
            continue
        (a0, f0), (a1, f1) = samples[k], samples[min(k + 1, len(samples) - 1)]
        out.append(f0 if a1 == a0 else f0 + (f1 - f0) * (x - a0) / (a1 - a0))
    return out


def _legend(ax: Axes, handles: list[Artist], labels: list[str], seeds: int) -> None:
    """The grid, and the legend right of the plot, with the seeds' band explained."""
    from matplotlib.patches import Rectangle

    if seeds > 1:
        handles.append(Rectangle((0, 0), 1, 1, color="0.5", alpha=0.3))
        labels.append(f"band: lowest to highest\nof {seeds} seeds")
    ax.grid(alpha=0.3)
    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.12, 1.0),
        fontsize=9,
        borderaxespad=0.0,
        labelspacing=0.9,
    )


def _what(experiment: Experiment) -> str:
    """What the percentages are of."""
    return "GPU memory" if experiment.memory else "GPU"


def _asked(experiment: Experiment) -> str:
    """What arrived % counts."""
    return "gpu-mem as written" if experiment.memory else "GPU requests"


def _from_zero(ax: Axes, highest: float, experiment: Experiment) -> None:
    """Y from 0 to above ``highest`` %, with GPUs on a second axis on the right.

    From 0 so that a gap between lines reads as the share of the cluster it is; the GPUs say
    what that share is on this cluster (in memory units, GPUs' worth of memory).
    """
    ax.set_ylim(0.0, max(1.0, highest) * 1.08)
    gpus = experiment.gpus
    if not gpus:
        return
    import numpy as np

    right = ax.secondary_yaxis(
        "right", functions=(partial(np.multiply, gpus / 100.0), partial(np.multiply, 100.0 / gpus))
    )
    worth = "GPUs' worth of memory" if experiment.memory else "GPUs"
    right.set_ylabel(f"{worth} (of {gpus})")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _least(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return min(finite) if finite else math.nan


def _most(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan
