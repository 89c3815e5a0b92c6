"""`gpushare simulate` models what the chart deploys unless told the paper's protocol, says which
it runs, writes the files its help promises, and draws plots that read at a glance."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest
import yaml
from click.testing import CliRunner
from matplotlib.figure import Figure

from gpushare.cli import main
from gpushare.cli.simulate import CHART_POLICY, model_line
from gpushare.sim import gpumem, report, synthetic
from gpushare.sim.experiment import run_experiment

VALUES = Path(__file__).resolve().parents[3] / "charts" / "gpushare" / "values.yaml"
QUICK = ["simulate", "--seeds", "1", "--workers", "1"]


def test_the_default_model_is_the_charts_policy_and_unit() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert values["policy"] == CHART_POLICY and CHART_POLICY in gpumem.policies()
    unit = next(p for p in main.commands["simulate"].params if p.name == "unit_text")
    assert unit.default == values["gpuMemoryUnit"]
    line = model_line("memory", "paper", values["gpuMemoryUnit"], "share")
    assert f"the chart runs {values['policy']}" in line and "--accounting milli" in line


def test_simulate_runs_the_charts_model_by_default_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = CliRunner().invoke(main, [*QUICK, "--policy", CHART_POLICY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("model: what the chart deploys: the extender's scheduler core")
    assert "aliyun.com/gpu-mem in 1GiB units" in first and "--accounting milli" in first
    document = json.loads((out / "report.json").read_text())
    assert document["trace"] == "synthetic (memory, 1GiB, share)"
    # every file the help promises in memory accounting, and nothing else
    assert sorted(p.name for p in out.iterdir()) == ["curve.png", "report.json", "table.md"]
    bad = CliRunner().invoke(main, [*QUICK, "--policy", "bestfit", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "not a policy in memory accounting" in bad.output


def test_the_papers_protocol_is_one_flag_away_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = [*QUICK, "--accounting", "milli", "--policy", "bestfit", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("model: the FGD paper's milli-GPU protocol (--accounting milli)")
    assert "not with the chart's deployment" in first
    assert json.loads((out / "report.json").read_text())["trace"] == "synthetic"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["curve.png", "fragmentation.png", "report.json", "table.md"]
    helped = CliRunner().invoke(main, ["simulate", "--help"]).output
    assert all(name in helped for name in files)


def test_churn_stays_in_milli_accounting_and_says_so() -> None:
    line = model_line("milli", "churn", "1GiB", "share")
    assert "churn protocol in the FGD paper's milli-GPU accounting" in line


def _figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """Every figure the report saves, by file name, kept for a look at its axes."""
    matplotlib.use("Agg")
    saved: dict[str, Figure] = {}
    real = Figure.savefig

    def keep(fig: Figure, path: object, *args: object, **kwargs: object) -> None:
        saved[Path(str(path)).name] = fig
        real(fig, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", keep)
    monkeypatch.setattr("matplotlib.pyplot.close", lambda fig=None: None)
    return saved


@pytest.mark.parametrize("memory", [False, True])
def test_plots_start_at_zero_and_give_gpus_beside_percent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: bool
) -> None:
    saved = _figures(monkeypatch)
    nodes = synthetic.nodes()[:30]
    experiment = run_experiment(
        "synthetic",
        nodes,
        synthetic.pods(nodes),
        ["gpushare" if memory else "bestfit"],
        [0, 1],
        offline=False,
        lp_bound=False,
        memory=gpumem.MemorySettings() if memory else None,
    )
    report.write(experiment, tmp_path)
    assert sorted(saved) == (["curve.png"] if memory else ["curve.png", "fragmentation.png"])
    gpus = sum(n.gpus for n in nodes)
    for name, fig in saved.items():
        ax = fig.axes[0]
        assert ax.get_ylim()[0] == 0.0, name
        right = [a.get_ylabel() for a in ax.child_axes]
        worth = "GPUs' worth of memory" if memory else "GPUs"
        assert right == [f"{worth} (of {gpus})"], name
        assert "%" in ax.get_ylabel(), name
        assert "frag" not in ax.get_title().lower(), name
    assert saved["curve.png"].axes[0].collections, "the band from the lowest to the highest seed"
