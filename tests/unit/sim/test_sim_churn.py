"""The churn protocol: pods leave after their trace run time, waiting pods are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.sim.churn import MIN_RUN_S, remove, run_churn
from gpushare.sim.milligpu import Cluster
from gpushare.sim.openb import TraceNode, TracePod, read_pods

NODE = TraceNode("n", cpu_milli=4000, memory_mib=1 << 20, gpus=2, model="G")
POD = TracePod("p", cpu_milli=3000, memory_mib=1, num_gpu=1, gpu_milli=1000, duration_s=3600)


def test_a_pod_short_of_cpu_waits_for_a_departure_and_is_counted() -> None:
    # Two GPUs, CPU for one 3-core pod at a time, load 100 %: two pods arrive at 0, one runs and
    # one waits an hour; at each departure the waiting pod starts and a new one arrives. Four
    # pods (volume 2 capacities): one GPU idle and one GPU waiting all along, for two hours.
    run = run_churn([NODE], [POD], "bestfit", 0, load=1.0, volume=2.0)
    assert run.arrived == 4
    assert run.window_h == pytest.approx(2.0)
    assert run.unallocated_gpus == pytest.approx(1.0)
    assert run.unallocated_pct == pytest.approx(50.0)
    assert run.waited_gpu_hours == pytest.approx(2.0)
    assert (run.waited_pods, run.mean_wait_h, run.longest_wait_h) == (2, 1.0, 1.0)
    assert [point[1:] for point in run.series[:1]] == [(1.0, 1.0)]


def test_pods_that_fit_never_wait_and_leave_after_their_own_time() -> None:
    roomy = TraceNode("n", cpu_milli=64000, memory_mib=1 << 20, gpus=2, model="G")
    run = run_churn([roomy], [POD], "gpushare", 0, load=1.0, volume=2.0)
    assert (run.waited_pods, run.waited_gpu_hours, run.unallocated_gpus) == (0, 0.0, 0.0)
    assert run.window_h == pytest.approx(1.0)


def test_a_pod_the_trace_deleted_at_once_still_runs_a_minute() -> None:
    instant = TracePod("i", 3000, 1, 1, 1000, duration_s=0)
    run = run_churn([NODE], [instant], "fgd", 0, load=1.0, volume=2.0)
    assert run.window_h == pytest.approx(2 * MIN_RUN_S / 3600)


def test_removing_a_pod_gives_back_what_placing_it_took() -> None:
    cluster = Cluster([NODE])
    before = (cluster.cpu.copy(), cluster.mem.copy(), cluster.free.copy())
    cluster.place(0, POD, [1])
    remove(cluster, 0, POD, [1])
    assert [a.tolist() for a in (cluster.cpu, cluster.mem, cluster.free)] == [
        a.tolist() for a in before
    ]
    assert cluster.version[0] == 2  # cached scores of the node are stale after each


def test_the_trace_run_time_is_deletion_less_creation(tmp_path: Path) -> None:
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "a,1000,10,1,500,100,3700\nb,1000,10,1,500,,\n"
    )
    assert [p.duration_s for p in read_pods(csv)] == [3600, 0]


def test_simulate_churn_writes_the_files_its_help_promises(tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = ["simulate", "--protocol", "churn", "--policy", "bestfit", "--policy", "fgd"]
    result = CliRunner().invoke(main, [*args, "--seeds", "2", "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["churn.json", "churn.md", "churn.png"]
    assert "waited minus FGD" in (out / "churn.md").read_text()
    runs = json.loads((out / "churn.json").read_text())["runs"]
    assert sorted((r["policy"], r["seed"]) for r in runs) == [
        ("bestfit", 0),
        ("bestfit", 1),
        ("fgd", 0),
        ("fgd", 1),
    ]


def test_churn_refuses_the_memory_accounting() -> None:
    args = ["simulate", "--protocol", "churn", "--accounting", "memory"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--protocol churn runs in milli accounting" in result.output
