"""Filter rules and their reasons, GPU choice, and scoring."""

from __future__ import annotations

import pytest

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger, NodeUsage
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode, NodeInventory, read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.filtering import Code, Rules, filter_node
from gpushare.core.placement.ranking import single_top
from gpushare.core.records.allocation import plan
from gpushare.kube.objects import gpu_node, gpu_pod


def req(mem: int, core: int | None = None, count: str | None = None, name: str = "p") -> PodRequest:
    pod = gpu_pod(name, mem=mem, core=core, gpu_count=count)
    pod["metadata"]["uid"] = f"uid-{name}"
    result = read_pod(pod)
    assert isinstance(result, PodRequest)
    return result


def node(gpus: list[int], **kwargs: object) -> NodeInventory:
    return read_node(gpu_node("n", gpus_units=gpus, **kwargs))  # type: ignore[arg-type]


def hold(ledger: Ledger, inv: NodeInventory, request: PodRequest, *indexes: int) -> None:
    ledger.assume(plan(request, node=inv.name, indexes=indexes, unit=inv.unit))


def test_seed_reason_names_gpu_free_and_request() -> None:
    inv, ledger = node([15]), Ledger()
    hold(ledger, inv, req(13, name="big"), 0)
    verdict = filter_node(req(3), inv, ledger.usage("n"), rules=Rules())
    assert verdict.code is Code.UNSCHEDULABLE
    assert verdict.reasons == ("GPU0: 2/15 GiB free < 3 GiB requested",)


def test_fits_and_picks_best_fit_gpu_for_binpack() -> None:
    inv, ledger = node([15, 15, 15]), Ledger()
    hold(ledger, inv, req(10, name="a"), 1)
    hold(ledger, inv, req(5, name="b"), 2)
    verdict = filter_node(req(4), inv, ledger.usage("n"), rules=Rules())
    assert verdict.fits and verdict.gpus == (1,)


def test_spread_picks_most_free_gpu() -> None:
    inv, ledger = node([15, 15, 15], placement="spread"), Ledger()
    hold(ledger, inv, req(10, name="a"), 0)
    hold(ledger, inv, req(5, name="b"), 2)
    assert filter_node(req(4), inv, ledger.usage("n"), rules=Rules()).gpus == (1,)


def test_heterogeneous_gpus_are_judged_each_by_its_size() -> None:
    inv = node([8, 40])
    verdict = filter_node(req(16), inv, NodeUsage(), rules=Rules())
    assert verdict.fits and verdict.gpus == (1,)


def test_core_pod_only_fits_core_mem() -> None:
    verdict = filter_node(req(2, core=30), node([15]), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE
    assert "only ack.node.gpu.schedule=core_mem nodes share computing power" in verdict.message


def test_memory_only_pod_never_fits_core_mem() -> None:
    verdict = filter_node(req(2), node([15], mode=Mode.CORE_MEM), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE and "never share a node" in verdict.message


def test_core_is_counted_per_gpu() -> None:
    inv, ledger = node([15], mode=Mode.CORE_MEM), Ledger()
    hold(ledger, inv, req(2, core=80, name="a"), 0)
    verdict = filter_node(req(2, core=30), inv, ledger.usage("n"), rules=Rules())
    assert verdict.reasons == ("GPU0: 20/100% computing power free < 30% requested",)


def test_not_shared_node_is_unresolvable() -> None:
    verdict = filter_node(req(1), node([15], mode="default"), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE and "node is not shared" in verdict.message


def test_unhealthy_gpu_takes_nothing() -> None:
    verdict = filter_node(req(1), node([15, 15], unhealthy=[0, 1]), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNSCHEDULABLE
    assert verdict.reasons == ("GPU0: unhealthy", "GPU1: unhealthy")
    assert filter_node(req(1), node([15, 15], unhealthy=[0]), NodeUsage(), rules=Rules()).gpus == (
        1,
    )


@pytest.mark.parametrize(
    ("mode", "limited"),
    [(Mode.CGPU, True), (Mode.CORE_MEM, True), (Mode.MPS, True), (Mode.SHARE, False)],
)
def test_isolation_limits_pods_per_gpu(mode: Mode, limited: bool) -> None:
    inv, ledger = node([100], mode=mode), Ledger()
    core = 5 if mode is Mode.CORE_MEM else None
    # 20 pods x 5% would also fill core_mem's computing power, so that case uses limit 4.
    limit = 4 if mode is Mode.CORE_MEM else 20
    for i in range(limit):
        hold(ledger, inv, req(1, core=core, name=f"p{i}"), 0)
    rules = Rules(max_pods_per_gpu=4) if mode is Mode.CORE_MEM else Rules()
    verdict = filter_node(req(1, core=core), inv, ledger.usage("n"), rules=rules)
    assert verdict.fits is not limited
    if limited:
        assert verdict.reasons == (f"GPU0: {limit}/{limit} pods, the isolation limit per GPU",)


def test_mps_nodes_hold_16_pods_per_gpu_at_128mib() -> None:
    inv, ledger = node([120], mode=Mode.MPS, unit=MemoryUnit.MiB128), Ledger()
    assert inv.mode.isolated
    for i in range(16):
        hold(ledger, inv, req(1, name=f"p{i}"), 0)
    rules = Rules(cluster_unit=MemoryUnit.MiB128)
    verdict = filter_node(req(1), inv, ledger.usage("n"), rules=rules)
    assert verdict.reasons == ("GPU0: 16/16 pods, the isolation limit per GPU",)


def test_mps_nodes_take_one_gpu_pods_without_computing_power() -> None:
    inv = node([15, 15], mode=Mode.MPS)
    assert filter_node(req(4), inv, NodeUsage(), rules=Rules()).fits
    two = filter_node(req(4, count="2"), inv, NodeUsage(), rules=Rules())
    assert two.code is Code.UNRESOLVABLE and "node mode is mps" in two.message
    core = filter_node(req(4, core=30), inv, NodeUsage(), rules=Rules())
    assert core.code is Code.UNRESOLVABLE and "node mode is mps" in core.message


def test_isolation_limit_is_16_at_128mib_and_configurable() -> None:
    assert Rules().pod_limit(MemoryUnit.MiB128) == 16
    assert Rules(max_pods_per_gpu=4).pod_limit(MemoryUnit.GiB) == 4


def test_multi_gpu_needs_n_gpus_each_with_its_share() -> None:
    inv, ledger = node([15, 15, 15]), Ledger()
    hold(ledger, inv, req(12, name="a"), 0)
    verdict = filter_node(req(8, count="2"), inv, ledger.usage("n"), rules=Rules())
    assert verdict.fits and verdict.gpus == (1, 2)
    hold(ledger, inv, req(12, name="b"), 1)
    verdict = filter_node(req(8, count="2"), inv, ledger.usage("n"), rules=Rules())
    assert verdict.code is Code.UNSCHEDULABLE
    assert verdict.reasons[0] == "1 of 2 GPUs needed have room"


def test_more_gpus_than_the_node_has_is_unresolvable() -> None:
    verdict = filter_node(req(4, count="4"), node([15, 15]), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE and "needs 4 GPUs" in verdict.message


def test_request_larger_than_any_gpu_is_unresolvable() -> None:
    verdict = filter_node(req(16), node([15]), NodeUsage(), rules=Rules())
    assert verdict.code is Code.UNRESOLVABLE
    assert verdict.reasons == ("GPU0: 15 GiB total < 16 GiB requested",)


def test_unit_mismatch_is_unresolvable() -> None:
    inv = node([120], unit=MemoryUnit.MiB128)
    verdict = filter_node(req(1), inv, NodeUsage(), rules=Rules(cluster_unit=MemoryUnit.GiB))
    assert verdict.code is Code.UNRESOLVABLE and "set gpuMemoryUnit the same" in verdict.message


def test_unplaced_memory_counts_against_the_node() -> None:
    foreign = gpu_pod("foreign", mem=10, scheduler="default-scheduler")
    foreign["metadata"]["uid"] = "f"
    foreign["spec"]["nodeName"] = "n"
    ledger = Ledger.from_pods([foreign])
    verdict = filter_node(req(8), node([15]), ledger.usage("n"), rules=Rules())
    assert verdict.code is Code.UNSCHEDULABLE
    assert "held by pods on unknown GPUs" in verdict.message


def test_binpack_prefers_the_fuller_node_and_spread_the_emptier() -> None:
    busy, empty = (
        read_node(gpu_node("busy", gpus_units=[15, 15])),
        read_node(gpu_node("empty", gpus_units=[15, 15])),
    )
    ledger = Ledger()
    hold(ledger, busy, req(6, name="a"), 0)
    pod = gpu_pod("new", mem=3)
    binpack = Scheduler(Settings()).prioritize(pod, [busy, empty], ledger)
    spread = Scheduler(Settings(policy="spread")).prioritize(pod, [busy, empty], ledger)
    assert binpack["busy"] > binpack["empty"]
    assert spread["busy"] < spread["empty"]
    assert all(0 <= s <= 10 for s in [*binpack.values(), *spread.values()])


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "gpushare"])
def test_one_node_alone_keeps_the_top_score_among_equals(policy: str) -> None:
    # kube-scheduler picks at random among equal totals (and likes empty nodes): equal
    # candidates must resolve to the same node every time, the first name among them
    nodes = [read_node(gpu_node(n, gpus_units=[15, 15])) for n in ("c", "a", "b")]
    full = read_node(gpu_node("full", gpus_units=[2]))
    pod = gpu_pod("new", mem=3)
    scheduler = Scheduler(Settings(policy=policy))
    scores = scheduler.prioritize(pod, [*nodes, full], Ledger())
    top = max(scores.values())
    assert [n for n, v in scores.items() if v == top] == ["a"]
    assert scores["b"] == scores["c"] == top - 1 and scores["full"] == 0
    table = NodeTable((n.name, n) for n in [*nodes, full])
    names = ["c", "full", "a", "b"]
    assert scheduler.prioritize_names(pod, names, table, Ledger()) == [scores[n] for n in names]


def test_single_top_lifts_the_chosen_node_when_every_score_is_zero() -> None:
    raw = {"x": 0.01, "y": 0.02, "z": 0.02, "gone": None}
    assert single_top(["x", "y", "z", "gone"], [0, 0, 0, 0], raw.get) == [0, 1, 0, 0]
    assert single_top(["x", "y"], [3, 7], raw.get) == [3, 7]
    assert single_top([], [], raw.get) == []


def test_unknown_policy_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="choose one of: binpack, fgd, gpushare, spread"):
        Scheduler(Settings(policy="magic"))


def test_a_node_whose_kubelet_allocates_less_gpu_memory_than_published_is_checked_against_it() -> (
    None
):
    """kube-scheduler ignores gpu-mem (``ignoredByScheduler``), so the filter holds a pod off a
    node whose device plugin is not registered with kubelet yet (allocatable 0) or whose
    devices are partly withdrawn: kubelet would refuse it at admission and fail it for good."""
    published = gpu_node("n", gpus_units=[15, 15])

    def with_allocatable(units: int) -> NodeInventory:
        raw = {**published, "status": {**published["status"]}}
        raw["status"]["allocatable"] = {**raw["status"].get("allocatable", {})}
        raw["status"]["allocatable"]["aliyun.com/gpu-mem"] = str(units)
        return read_node(raw)

    empty = NodeUsage()
    unregistered = filter_node(req(4), with_allocatable(0), empty, rules=Rules())
    assert unregistered.code is Code.UNSCHEDULABLE
    assert unregistered.message.endswith(
        "node: its device plugin is not serving: kubelet allocates none of the node's 30 GiB "
        "GPU memory (the plugin is restarting or not registered yet, or every device is "
        "unhealthy); kubelet would refuse the pod at admission"
    )
    half = with_allocatable(15)
    assert filter_node(req(10), half, empty, rules=Rules()).fits
    other = gpu_pod("other", mem=10, scheduler="default-scheduler")
    other["metadata"]["uid"] = "o"
    other["spec"]["nodeName"] = "n"
    held = Ledger.from_pods([other]).usage("n")
    refused = filter_node(req(10), half, held, rules=Rules())
    assert refused.code is Code.UNSCHEDULABLE and "10 GiB is held" in refused.message
    # kubelet allocating everything published adds no check of its own
    assert filter_node(req(10), with_allocatable(30), held, rules=Rules()).fits
