"""The memory-unit mode: the share mapping, the node and pod JSON, placing with the real core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.model.units import MemoryUnit
from gpushare.sim import gpumem, synthetic
from gpushare.sim.experiment import run_experiment
from gpushare.sim.gpumem import (
    MemoryCluster,
    MemorySettings,
    as_written,
    core_percent,
    node_json,
    pod_json,
    pod_units,
    share_units,
)
from gpushare.sim.kubeyaml import card_units
from gpushare.sim.openb import TraceError, TraceNode, TracePod

T4 = TraceNode("t4", 16_000, 64 * 1024, 2, "T4")


def test_470_milli_of_a_t4_is_7_gib_and_50_percent() -> None:
    assert card_units(T4, MemoryUnit.GiB) == 14  # 15109 MiB, rounded down as the plugin counts
    assert share_units(470, 14) == 7  # 6.58 rounded up
    assert card_units(T4, MemoryUnit.MiB128) == 118
    assert share_units(470, 118) == 56  # 7 GiB again
    assert share_units(1000, 14) == 14 and share_units(1, 14) == 1
    assert (core_percent(470), core_percent(1), core_percent(1000)) == (50, 5, 100)
    written = TracePod("p", 0, 0, 1, 215, gpu_mem_mib=3 * 1024)
    assert pod_units(written, 14, MemoryUnit.GiB) == 3  # a manifest asks for what it wrote


def test_node_and_pod_json_read_back_through_the_core() -> None:
    settings = MemorySettings(MemoryUnit.GiB, Mode.CORE_MEM)
    inventory = read_node(node_json(T4, settings))
    assert inventory.mode is Mode.CORE_MEM and [g.mem_units for g in inventory.gpus] == [14, 14]
    pod = TracePod("p", 2000, 4096, 2, 1000)
    obj = pod_json(pod, uid="7", units_per_gpu=14, core_per_gpu=100, unit=MemoryUnit.GiB)
    request = Scheduler(Settings()).read(obj)
    assert isinstance(request, PodRequest)
    assert (request.uid, request.mem_units, request.gpu_count, request.core_pct) == (
        "7",
        28,
        2,
        200,
    )
    assert obj["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "2000m",
        "memory": "4096Mi",
    }


def _place(cluster: MemoryCluster, pods: list[TracePod]) -> list[tuple[int, str]]:
    return [cluster.place(p, str(i)) for i, p in enumerate(pods)]


def test_binpack_packs_shares_and_counts_failures_by_reason() -> None:
    cluster = MemoryCluster([T4], policy="binpack")
    share = TracePod("s", 1000, 1024, 1, 470)
    placed = _place(cluster, [share] * 4 + [share, TracePod("w", 1000, 1024, 1, 1000)])
    assert placed == [(7, "")] * 4 + [(0, "GPU share"), (0, "1 whole GPU(s)")]
    usage = cluster.ledger.usage("t4")
    assert [usage.on(i).mem_units for i in (0, 1)] == [14, 14]  # two per GPU, GPU 0 first
    roomy = MemoryCluster([T4])
    assert _place(roomy, [TracePod("big", 20_000, 1, 1, 100), TracePod("c", 1, 1, 0, 0)]) == [
        (0, "CPU"),
        (0, ""),
    ]
    assert roomy.cpu[0] == 16_000 - 1


def test_a_share_asks_for_one_amount_sized_on_the_typical_card_it_may_use() -> None:
    v100 = TraceNode("v100", 64_000, 1 << 20, 1, "V100M32")
    nodes = [T4, v100]  # two 14 GiB T4s and one 31 GiB V100
    cluster = MemoryCluster(nodes, policy="binpack")
    assert _place(cluster, [TracePod("w", 1, 1, 1, 1000, ("V100M32",))]) == [(31, "")]
    assert _place(cluster, [TracePod("x", 1, 1, 1, 1000, ("A10",))]) == [(0, "GPU model")]
    assert cluster.capacity == 2 * 14 + 31
    half = TracePod("h", 0, 0, 1, 500)
    assert cluster.requested(half) == 7.0  # half of the T4 most GPUs are, wherever it lands
    written = as_written([half, TracePod("v", 0, 0, 2, 1000, ("V100M32",))], nodes, MemoryUnit.GiB)
    assert [(p.gpu_mem_mib, p.num_gpu) for p in written] == [(7 * 1024, 1), (31 * 1024, 2)]
    nowhere = TracePod("a", 0, 0, 1, 500, ("A10",))
    assert as_written([nowhere], nodes, MemoryUnit.GiB)[0].gpu_mem_mib == 0
    mostly_v100 = [T4, TraceNode("v4", 64_000, 1 << 20, 4, "V100M32")]
    assert as_written([half], mostly_v100, MemoryUnit.GiB)[0].gpu_mem_mib == 16 * 1024


def test_core_mem_and_cgpu_limits_come_from_the_core() -> None:
    core = MemoryCluster([T4], settings=MemorySettings(node_mode=Mode.CORE_MEM))
    pod = TracePod("c", 1, 1, 1, 100, gpu_mem_mib=1024, gpu_core_pct=60)
    assert _place(core, [pod] * 3) == [(1, ""), (1, ""), (0, "computing power")]
    assert sorted(core.ledger.usage("t4").on(i).core_pct for i in (0, 1)) == [60, 60]
    limited = MemoryCluster([T4], settings=MemorySettings(node_mode=Mode.CGPU, max_pods_per_gpu=2))
    small = TracePod("s", 1, 1, 1, 10)
    assert [r for _, r in _place(limited, [small] * 5)] == [""] * 4 + ["isolation pod limit"]
    share = MemoryCluster([T4])
    assert _place(share, [pod]) == [(0, "node mode")]  # computing power needs core_mem


def test_unknown_card_is_refused() -> None:
    with pytest.raises(TraceError, match=r"node x: model='H100' is not in the per-model"):
        MemoryCluster([TraceNode("x", 1, 1, 1, "H100")])


def test_replay_on_the_synthetic_workload_inflates_by_memory_as_written() -> None:
    nodes = synthetic.nodes()
    stream = gpumem.stream(synthetic.pods(nodes), nodes, seed=0)
    run = gpumem.replay(nodes, stream, "binpack", seed=0)
    assert 129 < run.arrived[-1] <= 130  # inflated by memory as written
    assert 0 < run.at(100) < 20 and sum(run.failed.values()) > 0
    assert set(gpumem.policies()) >= {"binpack", "spread"}
    experiment = run_experiment(
        "synthetic",
        nodes[:20],
        synthetic.pods(nodes[:20]),
        ["spread"],
        [0],
        memory=MemorySettings(),
    )
    assert experiment.policies == ["spread"]  # no offline reference in memory units


def test_cli_memory_mode(tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = ["simulate", "--accounting", "memory", "--seeds", "1", "--workers", "1"]
    result = CliRunner().invoke(
        main,
        [*args, "--policy", "binpack", "--gpu-memory-unit", "128MiB", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    document = json.loads((out / "report.json").read_text())
    assert document["policies"] == ["binpack"] and not (out / "fragmentation.png").exists()
    assert document["trace"] == "synthetic (memory, 128MiB, share)"
    bad = CliRunner().invoke(main, [*args, "--policy", "bestfit"])
    assert bad.exit_code == 2 and "'bestfit' is not a policy in memory accounting" in bad.output


def test_a_pod_no_node_can_take_is_still_learned() -> None:
    """The extender's cache counts every pod it watches, also one kube-scheduler's own filters
    refuse before asking the extender; the simulator's learned workload must count it too, or
    it refreshes at another pod than the real cluster's."""
    cluster = MemoryCluster([T4], policy="gpushare")
    assert cluster.scheduler.workload is not None
    placed = _place(cluster, [TracePod("big", 20_000, 1, 1, 500), TracePod("s", 1000, 1, 1, 500)])
    assert placed[0] == (0, "CPU")
    assert cluster.scheduler.workload.seen == 2
