"""The paper-mode simulator: trace reading, the arrival stream and BestFit's choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.sim.openb import TraceError, TraceNode, TracePod, read_nodes, read_pods
from gpushare.sim.paper import NodeState, bestfit, replay, target_workload
from gpushare.sim.stream import arrival_stream, capacity_milli

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "openb"


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
    run = replay(nodes, pods, bestfit)
    assert run.failed == 0
    states = [NodeState.of(n) for n in nodes]
    for pod in pods:
        feasible = [i for i, s in enumerate(states) if s.fits(pod)]
        index, _ = bestfit(states, pod, feasible)
        states[index].place(pod, states[index].choose_gpus(pod))
    # x on a:GPU0 (400 left), y best-fits there (100 left), z needs a fresh GPU: a:GPU1
    assert states[0].gpu_free == [100, 600] and states[1].gpu_free == [1000, 1000]
    assert run.arrived == [15.0, 22.5, 32.5] and run.at(32) == run.at(33) == 67.5


def test_target_workload_covers_95_percent_and_sums_to_one() -> None:
    pods = [TracePod(f"p{i}", 1000, 1, 1, 500) for i in range(95)]
    pods += [TracePod(f"q{i}", 2000, 1, 1, 250) for i in range(5)]
    workload = target_workload(pods)
    assert [w for _, w in workload] == [1.0]


@pytest.mark.skipif(not TRACES.exists(), reason="shared traces not beside the project")
def test_the_shared_trace_has_the_published_shape() -> None:
    nodes = read_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = read_pods(TRACES / "openb_pod_list_default.csv")
    assert (len(nodes), sum(n.gpus for n in nodes), len(pods)) == (1213, 6212, 8152)
    assert sum(p.num_gpu == 0 for p in pods) == 1088
