"""The paper-mode simulator: trace reading, the stream, the policies, the report and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.core.placement.fragmentation import (
    Shape,
    WorkloadEstimate,
    fgd_score,
    fragmentation,
    unused_by_copies,
)
from gpushare.sim import synthetic
from gpushare.sim.experiment import OFFLINE, run_experiment
from gpushare.sim.milligpu import (
    BestFit,
    Cluster,
    FragmentationPolicy,
    fgd,
    make_policy,
    replay,
    shape_of,
)
from gpushare.sim.openb import TraceError, TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.report import table
from gpushare.sim.stream import arrival_stream, capacity_milli

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "openb"


def test_reads_nodes_and_pods_and_names_bad_fields(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    assert read_nodes(nodes) == [TraceNode("n0", 64000, 262144, 2, "T4")]
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p0,1000,1024,1,470,T4|P100\np1,1000,1024,0,0,\n"
    )
    read = read_pods(pods)
    assert read[0].gpu_spec == ("T4", "P100") and read[0].gpu_request_milli == 470
    assert read[1].num_gpu == 0
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,abc,1,1,100\n")
    with pytest.raises(TraceError, match=r"pods\.csv:2: cpu_milli='abc' is not a number"):
        read_pods(pods)
    with pytest.raises(TraceError, match="header lacks column"):
        read_nodes(pods)


def test_stream_is_inflated_up_to_but_not_past_the_tune() -> None:
    nodes = [TraceNode(f"n{i}", 64000, 1 << 20, 4, "T4") for i in range(3)]
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 300 + 50 * (i % 5)) for i in range(10)]
    stream = arrival_stream(pods, nodes, seed=3)
    total = sum(p.gpu_request_milli for p in stream)
    assert total <= 1.3 * capacity_milli(nodes) < total + 500
    assert sorted(p.name for p in stream[:10]) == sorted(p.name for p in pods)
    assert stream == arrival_stream(pods, nodes, seed=3)


def test_bestfit_takes_the_fullest_node_and_the_tightest_gpu() -> None:
    nodes = [TraceNode("a", 64000, 1 << 20, 2, "T4"), TraceNode("b", 64000, 1 << 20, 2, "T4")]
    pods = [
        TracePod("x", 1000, 1, 1, 600),
        TracePod("y", 1000, 1, 1, 300),
        TracePod("z", 1000, 1, 1, 400),
    ]
    cluster = Cluster(nodes, seed=0)
    first = int(cluster.rank.argmin())
    policy = BestFit()
    for pod in pods:
        node, gpus = policy.choose(cluster, pod, cluster.feasible(pod))
        cluster.place(node, pod, gpus)
    # x on the seed's first node (ties by rank), y best-fits beside it, z needs a fresh GPU there
    assert cluster.free_of(first) == [100, 600] and cluster.free_of(1 - first) == [1000, 1000]
    run = replay(nodes, pods, BestFit())
    assert sum(run.failed.values()) == 0
    assert run.arrived == [15.0, 22.5, 32.5] and run.at(32) == run.at(33) == 67.5


def test_gpushare_leaves_cpu_beside_idle_gpus_that_fgd_calls_usable() -> None:
    # two 4-GPU nodes, one with CPU for two one-GPU pods of the workload, one with CPU for five
    nodes = [TraceNode("lean", 24000, 1 << 20, 4, "G2"), TraceNode("rich", 60000, 1 << 20, 4, "G2")]
    whole = TracePod("w", 11000, 1, 1, 1000)
    heavy = TracePod("h", 13000, 1, 0, 0)
    for seed in range(6):
        fgd_like = FragmentationPolicy("f", WorkloadEstimate.of([shape_of(whole)]))
        cluster = Cluster(nodes, seed=seed)
        node, _ = fgd_like.choose(cluster, heavy, cluster.feasible(heavy))
        assert node == int(cluster.rank.argmin())  # one-pod test: the same growth on both
        policy = make_policy("gpushare", [])
        policy.observe(whole)
        node, gpus = policy.choose(cluster, heavy, cluster.feasible(heavy))
        # on "lean" the CPU-only pod would leave CPU for one whole-GPU pod beside four idle GPUs
        assert cluster.nodes[node].name == "rich" and gpus == []


def test_workload_estimate_refreshes_less_often_as_it_settles() -> None:
    shape = Shape(1000, 500, 1)
    fixed, settling = WorkloadEstimate(refresh=10), WorkloadEstimate(refresh=10, settle=0.5)
    for _ in range(200):
        fixed.observe(shape)
        settling.observe(shape)
    assert fixed.version == 20  # the first pod, then every 10
    # after the first pod: every 10 until 20 seen, then every half of those seen (20, 30, 45, ...)
    assert 5 < settling.version < 10
    with pytest.raises(ValueError, match="settle=2"):
        WorkloadEstimate(settle=2)


def test_failures_are_counted_by_the_requirement_that_leaves_no_node() -> None:
    nodes = [TraceNode("a", 8000, 1 << 20, 1, "T4")]
    pods = [
        TracePod("x", 1000, 1, 1, 1000),
        TracePod("y", 1000, 1, 1, 1000),
        TracePod("v", 1000, 1, 1, 100, ("V100M32",)),
        TracePod("c", 9000, 1, 0, 0),
    ]
    run = replay(nodes, pods, BestFit())
    assert run.failed == {"1 whole GPU(s)": 1, "GPU model": 1, "CPU": 1}


def test_fragmentation_counts_what_the_workload_cannot_use() -> None:
    whole = Shape(cpu=1000, per_gpu=1000, count=1)
    half = Shape(cpu=1000, per_gpu=500, count=1)
    workload = ((whole, 0.5), (half, 0.5))
    # GPU1 (300 free) is a fragment for both shapes; GPU0 (1000) is usable by both
    assert fragmentation([1000, 300], 4000, "T4", workload) == 300
    # with no CPU left nothing runs: all idle share is fragment
    assert fragmentation([1000, 300], 0, "T4", workload) == 1300
    # a model the shapes exclude
    only_v100 = ((Shape(1000, 500, 1, ("V100M32",)), 1.0),)
    assert fragmentation([1000], 4000, "T4", only_v100) == 1000
    # stranded CPU beside full GPUs counts only when asked to
    assert fragmentation([0, 0], 4000, "T4", workload, cpu_weight=0.1) == pytest.approx(400)
    assert fgd_score(0, 1000) == 50 and fgd_score(-100, 1000) == 52
    assert fgd_score(-100, 1000, truncate=False) == pytest.approx(52.4979, abs=1e-3)


def test_counting_copies_sees_gpus_that_lose_their_cpu() -> None:
    whole = Shape(cpu=11000, per_gpu=1000, count=1)
    pair = Shape(cpu=1000, per_gpu=1000, count=2)
    # CPU for two one-GPU pods beside four idle GPUs: two GPUs are stranded
    assert unused_by_copies([1000, 1000, 1000, 1000], 22000, whole) == 2000
    assert fragmentation([1000] * 4, 22000, "G2", ((whole, 1.0),)) == 0  # the one-pod test
    assert fragmentation([1000] * 4, 22000, "G2", ((whole, 1.0),), copies=True) == 2000
    # CPU for 2.5 copies: half of the third GPU counts as used
    assert unused_by_copies([1000] * 4, 27500, whole) == pytest.approx(1500)
    # three free GPUs hold one two-GPU pod, whatever the CPU: the odd GPU is left
    assert unused_by_copies([1000, 300, 1000, 1000], 64000, pair) == 1300
    # CPU for two half-GPU pods: they take the two roomiest GPUs, the third stays unused
    half = Shape(cpu=1000, per_gpu=500, count=1)
    assert unused_by_copies([1000, 500, 1000], 2000, half) == 500
    assert unused_by_copies([1000, 500, 1000], 3000, half) == 0
    assert unused_by_copies([1000, 500, 1000], 0, half) == 2500


def test_workload_estimate_keeps_the_frequent_shapes_and_learns_online() -> None:
    a, b = Shape(1000, 500, 1), Shape(2000, 250, 1)
    fixed = WorkloadEstimate.of([a] * 95 + [b] * 5)
    assert fixed.top() == ((a, 1.0),)
    online = WorkloadEstimate(refresh=10)
    for _ in range(10):
        online.observe(b)
    assert online.top() == ((b, 1.0),)
    for _ in range(30):
        online.observe(a)
    assert [s for s, _ in online.top()] == [a, b] and online.seen == 40
    with pytest.raises(ValueError, match="coverage"):
        WorkloadEstimate(coverage=0)


def test_fgd_prefers_the_gpu_that_keeps_whole_gpus_free() -> None:
    nodes = [TraceNode("a", 64000, 1 << 20, 2, "T4"), TraceNode("b", 64000, 1 << 20, 2, "T4")]
    pods = [TracePod("w", 1000, 1, 1, 1000)] * 8 + [TracePod("s", 1000, 1, 1, 400)] * 8
    policy = fgd(pods)
    cluster = Cluster(nodes)
    for pod in [TracePod("s", 1000, 1, 1, 400), TracePod("s2", 1000, 1, 1, 400)]:
        node, gpus = policy.choose(cluster, pod, cluster.feasible(pod))
        cluster.place(node, pod, gpus)
    # the second small pod joins the first on its GPU instead of breaking a whole one
    assert sorted(sorted(cluster.free_of(i)) for i in range(2)) == [[200, 1000], [1000, 1000]]


def test_experiment_report_and_cli_on_the_built_in_workload(tmp_path: Path) -> None:
    nodes = synthetic.nodes()
    pods = synthetic.pods(nodes)
    assert 0.95 < sum(p.gpu_request_milli for p in pods) / capacity_milli(nodes) <= 0.98
    experiment = run_experiment("synthetic", nodes, pods, ["bestfit", "gpushare"], [0, 1])
    assert experiment.policies == ["bestfit", "gpushare", OFFLINE]
    rows = table(experiment)
    assert rows[0][:4] == ["policy", "90%", "95%", "100%"]
    assert len(rows) == 4 + bool(experiment.bound)  # the LP bound's row needs scipy
    mean, sd = experiment.summary("gpushare", 100)
    assert 0 < mean < 20 and sd >= 0
    diffs = [
        g.points[100] - b.points[100]
        for g, b in zip(experiment.of("gpushare"), experiment.of("bestfit"), strict=True)
    ]
    paired = experiment.paired("gpushare", "bestfit", 100)
    assert paired[0] == pytest.approx(sum(diffs) / 2)
    assert experiment.paired("gpushare", "gpushare", 100) == (0.0, 0.0)
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--accounting",
            "milli",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "r" / "report.json").read_text())
    assert document["policies"] == ["bestfit", "fgd", "gpushare", OFFLINE]
    assert (tmp_path / "r" / "curve.png").stat().st_size > 10_000
    bad = CliRunner().invoke(main, ["simulate", "--policy", "random"])
    assert bad.exit_code == 2 and "'random' is not a policy" in bad.output
    with pytest.raises(ValueError, match="not known"):
        make_policy("random", pods)
    assert shape_of(pods[0]).count == pods[0].num_gpu


@pytest.mark.skipif(not TRACES.exists(), reason="shared traces not beside the project")
def test_the_shared_trace_has_the_published_shape() -> None:
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = read_pods(TRACES / "openb_pod_list_default.csv")
    assert (len(nodes), sum(n.gpus for n in nodes), len(pods)) == (1213, 6212, 8152)
    assert sum(p.num_gpu == 0 for p in pods) == 1088


@pytest.mark.skipif(not TRACES.exists(), reason="shared traces not beside the project")
def test_seed_zero_reproduces_the_published_fgd_and_bestfit() -> None:
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = read_pods(TRACES / "openb_pod_list_default.csv")
    stream = arrival_stream(pods, nodes, seed=0)
    assert abs(replay(nodes, stream, fgd(pods), seed=0).at(100) - 4.77) < 0.3
    assert abs(replay(nodes, stream, BestFit(), seed=0).at(100) - 7.14) < 0.5
