"""Simulated nodes with a GPU topology: what following it changes, in both simulator modes."""

from __future__ import annotations

from gpushare.core.model.inventory import read_node
from gpushare.core.model.names import ANN_NODE_TOPOLOGY
from gpushare.core.model.topology import best_worst_pair, islands, layout, worst_pair
from gpushare.sim import synthetic
from gpushare.sim.experiment import run_seed
from gpushare.sim.gpumem import MemoryCluster, MemorySettings, node_json
from gpushare.sim.links import Connected, node_layouts
from gpushare.sim.milligpu import BestFit, Cluster, replay
from gpushare.sim.openb import TraceNode, TracePod
from gpushare.sim.stream import arrival_stream


def test_every_node_takes_the_layout_its_gpu_count_fits() -> None:
    nodes = [TraceNode(f"n{g}", 1000, 1024, g, "G3") for g in (1, 2, 3, 8)]
    pairs = node_layouts(nodes, "nvlink-pairs")
    assert pairs[0] == () and pairs[2] == ()  # one GPU; an odd count has no pairs
    assert pairs[1] == islands(2, 2) and pairs[3] == islands(8, 2)
    assert node_layouts(nodes, "") == [(), (), (), ()]


def test_best_connected_is_as_close_as_the_node_allows() -> None:
    eight = layout("nvlink-islands", 8)[0]
    assert best_worst_pair(eight, 4) == 1 and best_worst_pair(eight, 5) == 6
    assert worst_pair([0, 4], eight) == 6 and worst_pair([4, 7], eight) == 1
    connected = Connected()
    for chosen in ([0, 1], [3, 4], [0, 1, 2, 3, 4], [2]):
        connected.record(chosen, eight)
    connected.record([0, 1], ())  # no topology: not counted
    assert connected.counts == (3, 2)


def multigpu() -> tuple[list[TraceNode], list[TracePod]]:
    nodes = synthetic.nodes()
    return nodes, synthetic.pods(nodes, seed=0, mix=synthetic.workload("multigpu"))


def test_milli_mode_whole_gpus_follow_the_topology_at_no_packing_cost() -> None:
    nodes, pods = multigpu()
    stream = arrival_stream(pods, nodes, seed=1, tune=1.3)
    plain = replay(nodes, stream, BestFit(), seed=1)
    blind = replay(nodes, stream, BestFit(), seed=1, topology="nvlink-islands")
    aware = replay(nodes, stream, BestFit(), seed=1, topology="nvlink-islands", aware=True)
    # a layout the placement ignores only measures; the default run is untouched
    assert blind.unallocated == plain.unallocated and plain.connected == (0, 0)
    # whole GPUs are interchangeable for every later pod: the same curve, better-connected sets
    assert aware.unallocated == blind.unallocated
    assert aware.connected[0] == blind.connected[0] > 0
    assert aware.connected[1] > blind.connected[1]


def test_the_lowest_free_gpus_or_the_closest_ones() -> None:
    node = TraceNode("n", 64_000, 1 << 20, 8, "G2")
    pod = TracePod("p", 1, 1, 2, 1000)
    for aware, want in ((False, [0, 4]), (True, [4, 5])):
        cluster = Cluster([node], topology="nvlink-islands", aware=aware)
        cluster.free[0, [1, 2, 3]] = 0  # the lower island holds only GPU0 free
        assert cluster.best_fit_gpus(0, pod) == want


def g3_cluster(aware: bool) -> MemoryCluster:
    node = TraceNode("g3", 64_000, 1 << 20, 4, "G3")  # 4 cards of 29 GiB
    settings = MemorySettings(topology="nvlink-pairs", topology_aware=aware)
    return MemoryCluster([node], policy="binpack", settings=settings)


def test_memory_mode_publishes_the_layout_only_when_following_it() -> None:
    node = TraceNode("g3", 64_000, 1 << 20, 4, "G3")
    distance = layout("nvlink-pairs", 4)[0]
    shown = node_json(node, MemorySettings(topology="nvlink-pairs"), distance)
    assert read_node(shown).distance == distance
    hidden = node_json(
        node, MemorySettings(topology="nvlink-pairs", topology_aware=False), distance
    )
    assert ANN_NODE_TOPOLOGY not in hidden["metadata"]["annotations"]
    assert ANN_NODE_TOPOLOGY not in node_json(node, MemorySettings())["metadata"]["annotations"]


def test_memory_mode_the_core_takes_the_nvlink_pair_where_best_fit_splits_it() -> None:
    gib = 1024
    small = TracePod("small", 1, 1, 1, 300, gpu_mem_mib=10 * gib)
    big = TracePod("big", 1, 1, 1, 900, gpu_mem_mib=25 * gib)
    pair = TracePod("pair", 1, 1, 2, 400, gpu_mem_mib=10 * gib)
    held: dict[bool, list[int]] = {}
    for aware in (False, True):
        cluster = g3_cluster(aware)
        for step, pod in enumerate((small, big)):
            cluster.place(pod, str(step))
        assert cluster.free[0].tolist() == [19, 4, 29, 29]
        before = cluster.free[0].copy()
        assert cluster.place(pair, "2") == (20, "")
        held[aware] = [g for g in range(4) if cluster.free[0, g] != before[g]]
        assert cluster.connected.counts == (1, int(aware))
    assert held == {False: [0, 2], True: [2, 3]}


def test_run_seed_carries_the_counts_and_keeps_the_default() -> None:
    nodes, pods = multigpu()
    default = run_seed(nodes, pods, "binpack", 0, 1.3, 0, MemorySettings())
    aware = run_seed(nodes, pods, "binpack", 0, 1.3, 0, MemorySettings(), "nvlink-islands", True)
    assert default.connected == (0, 0) and aware.connected[0] > 0
    assert aware.points[100] == default.points[100]  # whole cards on this workload's nodes
