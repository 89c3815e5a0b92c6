"""The simulator's report: a table, a JSON file with every number, and pictures.

- ``table`` : unallocated GPU % at 90/95/100/110/130 % arrived, mean +- sd over seeds;
- ``report.json``: every point, curve, fragmentation sample and failure count;
- ``curve.png``: unallocated % against arrived %, one line per policy (mean over seeds);
- ``fragmentation.png``: the fragmented share of capacity along the run.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path

from gpushare.sim.experiment import CURVE_POINTS, OFFLINE, POINTS, Experiment

PUBLISHED = {
    "default": {"bestfit": 7.14, "fgd": 4.77},
    "gpushare40": {"bestfit": 8.56, "fgd": 6.04},
    "gpushare60": {"bestfit": 10.94, "fgd": 8.75},
    "gpushare80": {"bestfit": 13.34, "fgd": 10.92},
    "gpushare100": {"bestfit": 15.38, "fgd": 13.36},
}
"""The FGD artifact's cached results at 100 % arrived (BENCHMARKS.md)."""


def table(experiment: Experiment) -> list[list[str]]:
    """Rows: policy, then mean +- sd at each point, then the published value at 100 %."""
    published = PUBLISHED.get(experiment.trace, {})
    rows = [["policy", *[f"{p}%" for p in POINTS], "published@100"]]
    for policy in experiment.policies:
        row = [policy]
        for point in POINTS:
            mean, sd = experiment.summary(policy, point)
            row.append("-" if math.isnan(mean) else f"{mean:.2f} +- {sd:.2f}")
        value = published.get(policy)
        row.append(f"{value:.2f}" if value is not None else "")
        rows.append(row)
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
        m100, s100 = experiment.summary(policy, 100)
        m130, s130 = experiment.summary(policy, 130)
        cells = [experiment.trace, policy, f"{m100:.2f} +- {s100:.2f}", f"{m130:.2f} +- {s130:.2f}"]
        if published:
            value = known.get(policy)
            cells.append("" if value is None else f"{value:.2f}")
        for point in paired:
            versus = ""
            if reference in experiment.policies and policy not in (reference, OFFLINE):
                d, sd = experiment.paired(policy, reference, point)
                versus = f"{d:+.2f} +- {sd:.2f}"
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


def write(experiment: Experiment, out: Path, *, plots: bool = True) -> list[Path]:
    """Write report.json (and the pictures); returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        policy: {
            str(p): dict(zip(("mean", "sd"), experiment.summary(policy, p), strict=True))
            for p in POINTS
        }
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
        "published_at_100": PUBLISHED.get(experiment.trace, {}),
        "failed_by_reason": failures(experiment),
        "curve_grid_step_percent": 0.5,
        "runs": [asdict(r) for r in experiment.results],
    }
    files = [out / "report.json"]
    files[0].write_text(json.dumps(_finite(document), indent=1) + "\n")
    if plots:
        files += _plots(experiment, out)
    return files


def _finite(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _plots(experiment: Experiment, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [k * 0.5 for k in range(CURVE_POINTS)]
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy in experiment.policies:
        if policy == OFFLINE:
            means = [experiment.summary(OFFLINE, p)[0] for p in POINTS]
            ax.plot(POINTS, means, "k--o", label=OFFLINE)
            continue
        curves = [r.curve for r in experiment.of(policy)]
        mean = [_mean([c[k] for c in curves]) for k in range(CURVE_POINTS)]
        ax.plot(grid, mean, label=policy)
    ax.set_xlim(60, 130)
    ax.set_ylim(0, 45)
    ax.set_xlabel("arrived GPU request, % of capacity")
    ax.set_ylabel("unallocated GPU, % of capacity")
    ax.set_title(f"{experiment.trace}: {experiment.nodes} nodes, {len(experiment.seeds)} seed(s)")
    ax.grid(alpha=0.3)
    ax.legend()
    curve = out / "curve.png"
    fig.savefig(curve, dpi=110, bbox_inches="tight")
    plt.close(fig)

    if not any(r.fragmentation for r in experiment.results):
        return [curve]  # the memory mode does not sample fragmentation
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy in experiment.policies:
        runs = [r for r in experiment.of(policy) if r.fragmentation]
        if not runs:
            continue
        first = runs[0].fragmentation
        ax.plot(
            [a for a, _ in first], [f for _, f in first], label=f"{policy} (seed {runs[0].seed})"
        )
    ax.set_xlabel("arrived GPU request, % of capacity")
    ax.set_ylabel("fragmented idle GPU, % of capacity")
    ax.set_title("fragmentation against the trace's target workload")
    ax.grid(alpha=0.3)
    ax.legend()
    frag = out / "fragmentation.png"
    fig.savefig(frag, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [curve, frag]


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan
