"""The simulator's report for people: progress in a pipe, one seed, reasons, folders, the bound."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.sim import gpumem, lpbound, report, synthetic
from gpushare.sim.experiment import OFFLINE, POINTS, SeedResult, run_experiment
from gpushare.sim.milligpu import BestFit, replay
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.progress import PlainProgress, clock_text

SMALL = ["simulate", "--accounting", "milli", "--policy", "bestfit", "--workers", "1", "--no-plots"]


def test_piped_progress_prints_plain_lines_not_a_bar(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [*SMALL, "--seeds", "2", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("run ")]
    assert lines, result.output
    assert lines[0].startswith("run 1/4 (25 %): ") and "elapsed, about" in lines[0]
    assert lines[-1].startswith("run 4/4 (100 %): ") and lines[-1].endswith("elapsed")
    assert "\x1b[" not in result.stderr  # no cursor moves or colours in a pipe
    assert "\r" not in result.stderr


def test_plain_progress_says_at_most_a_line_every_few_seconds() -> None:
    now = [0.0]
    said: list[str] = []
    progress = PlainProgress(6, say=said.append, every=5.0, clock=lambda: now[0])
    for t in (1.0, 2.0, 7.0, 8.0, 9.0, 9.5):
        now[0] = t
        progress(SeedResult("fgd", 3, {}, seconds=0.5))
    # the first finished run, the one 6 s after it, and the last
    assert [line.split(":")[0] for line in said] == [
        "run 1/6 (16 %)",
        "run 3/6 (50 %)",
        "run 6/6 (100 %)",
    ]
    assert said[1] == "run 3/6 (50 %): fgd seed 3 done in 0.5 s; 0:07 elapsed, about 0:07 left"
    assert clock_text(3725) == "1:02:05" and clock_text(59.6) == "1:00"


def test_one_seed_shows_values_without_a_spread(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = CliRunner().invoke(main, [*SMALL, "--seeds", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "+- 0.00" not in result.output and "+-" not in result.stdout
    assert "n=1" in result.stdout
    document = json.loads((out / "report.json").read_text())
    assert document["summary"]["bestfit"]["100"]["n"] == 1
    assert document["summary"]["bestfit"]["100"]["sd"] is None
    table = (out / "table.md").read_text()
    assert "n=1" in table and "+-" not in table
    assert report.spread([4.0]) == "4.00" and report.spread([4.0, 6.0]) == "5.00 +- 1.41"
    assert report.spread([math.nan]) == "-" and report.spread([-0.5], signed=True) == "-0.50"


def test_failures_for_host_memory_say_host_memory() -> None:
    nodes = [TraceNode("a", 64000, 4096, 2, "T4")]
    pods = [TracePod("big", 1000, 8192, 1, 500)]
    assert replay(nodes, pods, BestFit()).failed == {"host memory": 1}
    run = gpumem.replay(nodes, gpumem.stream(pods, nodes, seed=0, tune=1.0), "binpack")
    assert set(run.failed) == {"host memory"}  # the stream repeats the pod up to capacity


def test_an_existing_report_folder_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.json").write_text("{}")
    refused = CliRunner().invoke(main, [*SMALL, "--seeds", "1", "--out", str(out)])
    assert refused.exit_code == 2
    assert f"the report folder {out} already holds files" in refused.stderr
    assert "--force" in refused.stderr and "--out NEW_FOLDER" in refused.stderr
    assert (out / "report.json").read_text() == "{}"
    forced = CliRunner().invoke(main, [*SMALL, "--seeds", "1", "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "report.json").read_text())["seeds"] == [0]
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = CliRunner().invoke(main, [*SMALL, "--seeds", "1", "--out", str(empty)])
    assert fresh.exit_code == 0, fresh.output  # an empty folder holds nothing to lose
    a_file = tmp_path / "file"
    a_file.write_text("x")
    wrong = CliRunner().invoke(main, [*SMALL, "--seeds", "1", "--out", str(a_file)])
    assert wrong.exit_code == 2 and "is a file" in wrong.stderr  # click's own check


def test_the_lp_solves_small_cases_by_hand() -> None:
    pytest.importorskip("scipy")
    # three 600-milli shares, two GPUs: one share per GPU, 1200 of 2000 milli
    assert lpbound.solve(Counter({600: 3}), 2, 2000) == pytest.approx(40.0)
    # three halves on two GPUs: 1500 of 2000
    assert lpbound.solve(Counter({500: 3}), 2, 2000) == pytest.approx(25.0)
    assert lpbound.solve(Counter(), 2, 2000) == 100.0
    stream = [
        TracePod("a", 0, 0, 1, 600),
        TracePod("b", 0, 0, 2, 1000),
        TracePod("c", 0, 0, 1, 300),
    ]
    assert lpbound.arrived_shares(stream, 2600) == Counter({600: 1, 1000: 2})


def test_the_lp_bound_is_below_every_policy_on_every_seed() -> None:
    pytest.importorskip("scipy")
    nodes = synthetic.nodes()[::3]
    pods = synthetic.pods(nodes)
    experiment = run_experiment("synthetic", nodes, pods, ["bestfit", "gpushare"], [0, 1])
    assert sorted(experiment.bound) == sorted(POINTS)
    for point in POINTS:
        for policy in experiment.policies:
            for k, result in enumerate(experiment.of(policy)):
                if not math.isnan(result.points[point]):
                    assert experiment.bound[point][k] <= result.points[point] + 1e-9
    assert report.table(experiment)[-1][0] == report.LP_LABEL


def test_without_scipy_the_report_says_offline_ffd_is_no_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lpbound, "available", lambda: False)
    nodes = synthetic.nodes()[::3]
    experiment = run_experiment("synthetic", nodes, synthetic.pods(nodes), ["bestfit"], [0, 1])
    assert experiment.bound == {} and experiment.policies == ["bestfit", OFFLINE]
    files = report.write(experiment, tmp_path)
    assert [f.name for f in files] == ["table.md", "report.json", "curve.png", "fragmentation.png"]
    text = (tmp_path / "table.md").read_text()
    assert (
        "offline-ffd: the arrived pods packed offline by first-fit-decreasing; not a bound" in text
    )
    assert report.LP_LABEL not in text and "lower is better" in text


def test_published_values_are_drawn_where_the_benchmark_doc_gives_them() -> None:
    marks = report.published_points("default")
    assert ("fgd", 100, 4.77) in marks and ("fgd", 130, 4.61) in marks
    assert ("bestfit", 130, 6.92) in marks
    assert [m for m in report.published_points("gpushare60") if m[1] == 130] == []
    assert report.published_points("synthetic") == []


def test_every_seed_samples_fragmentation_for_the_plots_band() -> None:
    nodes = synthetic.nodes()[::3]
    experiment = run_experiment(
        "synthetic", nodes, synthetic.pods(nodes), ["bestfit"], [0, 1, 2], offline=False
    )
    runs = experiment.of("bestfit")
    assert [r.seed for r in runs] == [0, 1, 2]
    assert all(len(r.fragmentation) >= 30 for r in runs)
    # each seed's samples, read on one grid: straight between samples, nothing outside them
    first = runs[0].fragmentation
    (a0, f0), (a1, f1) = first[-3], first[-2]
    middle = (a0 + a1) / 2
    read = report._along(first, [first[0][0] - 1, a0, middle, first[-1][0] + 1])
    assert math.isnan(read[0]) and math.isnan(read[3])
    assert read[1] == f0 and read[2] == pytest.approx((f0 + f1) / 2)
