"""Scarce shapes: the shortage price, the supply kept per node, the survey, the policy's use."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.placement.defragmenting import GPUSHARE, Defragmenter, FragmentationPolicy
from gpushare.core.placement.fragmentation import Shape, WorkloadEstimate, copies
from gpushare.core.placement.scarcity import (
    NORMAL_FROM,
    PRICE_FLOOR,
    RESERVE,
    WEIGHT,
    Supply,
    priceable,
    reserves,
    rounded,
    shortage,
)
from gpushare.core.placement.survey import Survey
from gpushare.core.records.allocation import plan
from gpushare.kube.objects import gpu_node, gpu_pod


def exact_tail(demand: float, whole: int) -> float:
    """P(Poisson(demand) >= whole) from log-space terms (no underflow)."""
    below = sum(math.exp(j * math.log(demand) - demand - math.lgamma(j + 1)) for j in range(whole))
    return 1.0 - below


def test_shortage_is_the_poisson_tail_of_the_whole_copies() -> None:
    for demand in (0.3, 1.0, 2.5, 7.0, 20.0):
        for whole in range(0, 30):
            assert shortage(demand, whole + 0.7) == pytest.approx(
                exact_tail(demand, whole) if whole else 1.0, abs=1e-9
            )
    # P(X >= 3) for X ~ Poisson(2): 1 - e^-2 (1 + 2 + 2)
    assert shortage(2.0, 3) == pytest.approx(1.0 - 5.0 * math.exp(-2.0), abs=1e-12)


def test_shortage_edges_no_supply_is_certain_no_demand_is_none() -> None:
    assert shortage(5.0, 0.0) == 1.0
    assert shortage(5.0, 0.99) == 1.0  # CPU for part of one pod is no copy
    assert shortage(0.0, 3.0) == 0.0
    assert shortage(0.0, 0.0) == 0.0
    assert shortage(1.0, 1000.0) == 0.0


@pytest.mark.parametrize("demand", [NORMAL_FROM, 80.0, 400.0, 900.0])
def test_large_demands_use_the_normal_tail_close_to_the_exact_one(demand: float) -> None:
    spread = math.sqrt(demand)
    for whole in (int(demand - 2 * spread), int(demand), int(demand + 2 * spread)):
        assert shortage(demand, whole) == pytest.approx(exact_tail(demand, whole), abs=0.02)


def test_shortage_grows_as_supply_shrinks_and_demand_grows() -> None:
    by_supply = [shortage(6.0, s) for s in range(20, 0, -1)]
    assert by_supply == sorted(by_supply)
    by_demand = [shortage(d / 2, 8) for d in range(1, 40)]
    assert by_demand == sorted(by_demand)


def test_prices_round_down_to_powers_of_two_and_small_ones_are_none() -> None:
    assert rounded(PRICE_FLOOR / 2) == 0.0
    assert rounded(PRICE_FLOOR) == PRICE_FLOOR
    assert rounded(0.3) == 0.25
    assert rounded(0.99) == 0.5
    assert rounded(1.0) == 1.0


LIGHT = Shape(cpu=2000, per_gpu=4, count=1)
WHOLE8 = Shape(cpu=8000, per_gpu=16, count=8)


def estimate(*shapes: tuple[Shape, int]) -> WorkloadEstimate:
    return WorkloadEstimate.of([s for s, n in shapes for _ in range(n)], coverage=1.0)


EMPTY8 = ((16,) * 8, 96_000, "A100")


def test_supply_counts_copies_per_node_and_prices_the_shape_running_out() -> None:
    workload = estimate((LIGHT, 90), (WHOLE8, 10))
    supply = Supply(workload)
    for i in range(3):
        supply.update(f"n{i}", EMPTY8)
    counts = dict(supply.counts())
    assert counts[WHOLE8] == 3.0
    assert counts[LIGHT] == 3 * 8  # a copy takes its GPU whole, as fragmentation counts it
    prices = dict(supply.prices().shapes)
    # idle 3 x 128 units at a mean 0.9 x 4 + 0.1 x 128 = 16.4 units per pod: 23.4 pods to come,
    # 2.34 of them 8-GPU against 3 homes
    assert prices[WHOLE8] == rounded(shortage(0.1 * 384 / 16.4, 3)) > 0
    assert LIGHT not in prices  # one GPU of any model: never priced (``priceable``)


def test_only_shapes_that_need_several_gpus_or_some_models_are_priced() -> None:
    assert priceable(WHOLE8)
    assert priceable(Shape(cpu=1000, per_gpu=4, count=1, models=("T4",)))
    assert not priceable(LIGHT)
    assert not priceable(Shape(cpu=1000, per_gpu=0, count=0))


def test_copies_are_whole_gpu_sets_and_fractional_cpu() -> None:
    assert copies((16,) * 8, 96_000, "A100", WHOLE8) == 1.0
    assert copies((16,) * 8, 4_000, "A100", WHOLE8) == 0.5
    assert copies((16,) * 7 + (15,), 96_000, "A100", WHOLE8) == 0.0
    assert copies((16,) * 8, 96_000, "A100", Shape(8000, 16, 8, models=("H100",))) == 0.0
    assert copies((16,) * 8, 96_000, "A100", Shape(8000, 0, 0)) == 0.0


def test_the_supply_counts_only_whole_pods_a_node_can_host() -> None:
    """An empty 96-core node holds 0.8 of a 120-core 8-GPU pod as ``copies`` counts it, and no
    pod: neither the cluster's supply nor what the node's priced copies are worth count it."""
    big = Shape(cpu=120_000, per_gpu=16, count=8)
    workload = estimate((LIGHT, 90), (big, 10))
    supply = Supply(workload)
    for i in range(5):
        supply.update(f"g2-{i}", EMPTY8)
    supply.update("g3", ((16,) * 8, 128_000, "A100"))
    assert copies(*EMPTY8, big) == pytest.approx(0.8)
    assert dict(supply.counts())[big] == 1.0  # the 128-core node alone, not 1 + 5 x 0.8
    prices = supply.prices()
    assert dict(prices.shapes)[big] == rounded(shortage(0.1 * 6 * 128 / 16.4, 1))
    assert prices.held(*EMPTY8) == 0.0
    assert prices.held((16,) * 8, 128_000, "A100") == WEIGHT * dict(prices.shapes)[big] * 128


states = st.tuples(
    st.lists(st.integers(0, 16), min_size=0, max_size=8).map(lambda f: tuple(sorted(f))),
    st.integers(0, 96_000),
    st.sampled_from(["A100", "H100"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.none() | states), max_size=40))
def test_updating_node_by_node_equals_counting_the_final_states_afresh(
    steps: list[tuple[int, tuple[tuple[int, ...], int, str] | None]],
) -> None:
    workload = estimate((LIGHT, 50), (WHOLE8, 10), (Shape(4000, 8, 2, ("H100",)), 20))
    kept = Supply(workload)
    final: dict[int, tuple[tuple[int, ...], int, str]] = {}
    for name, state in steps:
        kept.update(name, state)
        if state is None:
            final.pop(name, None)
        else:
            final[name] = state
    fresh = Supply(workload)
    for name, state in final.items():
        fresh.update(name, state)
    assert kept.counts() == fresh.counts()
    assert kept.prices().shapes == fresh.prices().shapes
    assert len(kept) == len(final)


def test_a_new_workload_recounts_every_node() -> None:
    workload = WorkloadEstimate(refresh=1)
    supply = Supply(workload)
    supply.update("a", EMPTY8)
    workload.observe(WHOLE8)
    assert supply.counts() == ((WHOLE8, 1.0),)
    workload.observe(LIGHT)
    workload.observe(LIGHT)
    assert dict(supply.counts())[LIGHT] == 8.0


def test_the_price_version_changes_only_when_the_priced_shapes_do() -> None:
    workload = estimate((LIGHT, 90), (WHOLE8, 10))
    supply = Supply(workload)
    for i in range(100):  # 78 eight-GPU pods expected for 100 homes: no price
        supply.update(i, EMPTY8)
    first = supply.prices()
    assert first.shapes == ()
    supply.update(0, ((0,) + (16,) * 7, 94_000, "A100"))
    assert supply.prices().version == first.version
    for i in range(1, 60):
        supply.update(i, ((0,) + (16,) * 7, 94_000, "A100"))
    assert dict(supply.prices().shapes).get(WHOLE8, 0.0) > 0.0
    assert supply.prices().version > first.version


def test_a_light_pod_keeps_off_the_last_empty_big_node_once_it_is_scarce() -> None:
    """The ``models`` failure in miniature: the empty node scores better on fragmentation
    alone (its CPU balances), and the price of the last 8-GPU home turns that round."""
    heavy = Shape(cpu=16_000, per_gpu=16, count=1)  # 16 cores per GPU on a 12-per-GPU node
    workload = estimate((LIGHT, 49), (heavy, 49), (WHOLE8, 2))
    used = ((0, 0, 0, 0, 16, 16, 16, 16), 64_000, "A100")  # CPU for exactly four heavy pods
    unpriced = Defragmenter(workload, replace(GPUSHARE, scarcity=False))
    empty_growth = unpriced.growth(*EMPTY8, LIGHT, [0])
    used_growth = unpriced.growth(*used, LIGHT, [4])
    assert empty_growth < used_growth  # fragmentation alone opens the empty node
    plain = Defragmenter(workload, GPUSHARE)
    assert plain.supply is not None
    plain.supply.update("empty", EMPTY8)
    plain.supply.update("used", used)
    priced = dict(plain.prices.shapes)
    assert priced[WHOLE8] > 0.0
    # the last 8-GPU home costs its price on the empty node; the used node has none to take
    assert plain.growth(*EMPTY8, LIGHT, [0]) - empty_growth >= WEIGHT * priced[WHOLE8] * 8 * 16
    assert plain.growth(*used, LIGHT, [4]) - used_growth < WEIGHT * priced[WHOLE8] * 8 * 16
    assert plain.growth(*EMPTY8, LIGHT, [0]) > used_growth  # and now the used node wins


def node(name: str, gpus: list[int], cpu: str = "96") -> NodeInventory:
    obj = gpu_node(name, gpus_units=gpus)
    obj["status"]["allocatable"]["cpu"] = cpu
    return read_node(obj)


def request(name: str, mem: int, count: int = 1) -> PodRequest:
    obj = gpu_pod(name, mem=mem)
    obj["metadata"]["uid"] = f"uid-{name}"
    result = read_pod(obj)
    assert isinstance(result, PodRequest)
    return result


def test_the_survey_follows_binds_and_node_changes_through_the_change_logs() -> None:
    workload = estimate((Shape(cpu=0, per_gpu=16, count=2), 1))
    supply = Supply(workload)
    survey = Survey(supply)
    table = NodeTable((n.name, n) for n in (node("a", [16, 16]), node("b", [16, 16])))
    ledger = Ledger()
    survey.follow(table, ledger)
    assert supply.counts()[0][1] == 2.0
    ledger.assume(plan(request("p", 4), node="a", indexes=[0], unit=table["a"].unit))
    survey.follow(table, ledger)
    assert supply.counts()[0][1] == 1.0
    table["c"] = node("c", [16, 16])
    survey.follow(table, ledger)
    assert supply.counts()[0][1] == 2.0
    del table["b"]
    survey.follow(table, ledger)
    assert supply.counts()[0][1] == 1.0
    ledger.unassume("uid-p")
    survey.follow(table, ledger)
    assert supply.counts()[0][1] == 2.0
    survey.follow(NodeTable(), ledger)  # a relist's new table starts over
    assert supply.counts()[0][1] == 0.0 and len(supply) == 0


def test_without_a_table_the_survey_counts_every_node_shown_so_far() -> None:
    supply = Supply(estimate((Shape(cpu=0, per_gpu=16, count=2), 1)))
    survey = Survey(supply)
    ledger = Ledger()
    survey.show([node("a", [16, 16])], ledger)
    survey.show([node("b", [16, 16])], ledger)
    assert supply.counts()[0][1] == 2.0


def test_the_scheduler_prices_over_the_whole_cluster_not_the_nodes_of_one_call() -> None:
    table = NodeTable((n.name, n) for n in (node(f"n{i}", [16, 16]) for i in range(5)))
    scheduler = Scheduler(Settings(policy="gpushare"))
    policy = scheduler.policy
    assert isinstance(policy, FragmentationPolicy) and policy.defragmenter.supply is not None
    obj = gpu_pod("p", mem=4)
    obj["metadata"]["uid"] = "uid-p"
    scheduler.filter(obj, [table["n0"]], Ledger(), cluster=table)
    assert len(policy.defragmenter.supply) == 5
    lone = Scheduler(Settings(policy="gpushare"))
    lone.filter(obj, [table["n0"], table["n1"]], Ledger())
    lone_policy = lone.policy
    assert isinstance(lone_policy, FragmentationPolicy) and lone_policy.defragmenter.supply
    assert len(lone_policy.defragmenter.supply) == 2


def test_a_price_change_makes_cached_decisions_stale() -> None:
    workload = estimate((LIGHT, 90), (WHOLE8, 10))
    defragmenter = Defragmenter(workload, GPUSHARE)
    assert defragmenter.supply is not None
    for i in range(100):
        defragmenter.supply.update(i, EMPTY8)
    before = defragmenter.version
    assert defragmenter.version == before  # asking again changes nothing
    for i in range(60):
        defragmenter.supply.update(i, ((0,) + (16,) * 7, 94_000, "A100"))
    assert defragmenter.version != before


def _restricted_workload(restricted: int, unrestricted: int) -> WorkloadEstimate:
    """Pods seen: ``restricted`` one-GPU pods for model R3 (each of its own share, as rare
    shapes are), and ``unrestricted`` half-GPU pods for any model."""
    workload = WorkloadEstimate(refresh=1)
    for i in range(restricted):
        workload.observe(Shape(0, 400 + i, 1, ("R3",)))
    for _ in range(unrestricted):
        workload.observe(Shape(0, 500, 1))
    return workload


def test_reserves_pool_the_restricted_pods_into_a_whole_node_of_their_models() -> None:
    workload = _restricted_workload(restricted=4, unrestricted=96)
    # rare shapes are not in the top shapes, so only the pooled restriction remembers them
    assert all(not shape.models for shape, _ in workload.top())
    (restriction,) = workload.restricted()
    assert restriction.models == ("R3",)
    assert restriction.fraction == pytest.approx(0.04)
    assert restriction.per_gpu == 403
    (pair,) = reserves(workload.restricted(), {"R3": 8, "R2": 4})
    assert pair == (Shape(0, 403, 8, ("R3",)), pytest.approx(RESERVE * 0.04))
    assert reserves(workload.restricted(), {"R2": 8}) == ()  # no node of the model: none


def test_the_reserve_is_priced_only_when_the_last_whole_nodes_of_a_model_go() -> None:
    workload = _restricted_workload(restricted=2, unrestricted=98)
    supply = Supply(workload)
    for i in range(40):
        supply.update(f"common-{i}", ((1000,) + (0,) * 7, 0, "R2"))  # mostly full
    for i in range(6):
        supply.update(f"rare-{i}", ((1000,) * 8, 0, "R3"))
    reserve = Shape(0, 401, 8, ("R3",))
    # 88 GPUs idle at 500 per pod: 176 pods to come, 2 % restricted to R3, RESERVE of those
    # whole-node: a demand of about 0.7 against 6 whole nodes, then against 1
    assert dict(supply.counts())[reserve] == 6.0
    assert reserve not in dict(supply.prices().shapes)  # six whole nodes: no shortage
    for i in range(5):
        supply.update(f"rare-{i}", ((1000,) * 7 + (0,), 0, "R3"))
    assert dict(supply.counts())[reserve] == 1.0
    price = dict(supply.prices().shapes)[reserve]
    assert price > 0.0
    # what a node holds drops by the reserve's worth when the last whole one is opened
    assert supply.prices().held((1000,) * 8, 0, "R3") == pytest.approx(WEIGHT * price * 8 * 401)


def test_a_larger_node_of_a_model_resizes_its_reserve() -> None:
    workload = _restricted_workload(restricted=2, unrestricted=98)
    supply = Supply(workload)
    supply.update("small", ((1000,) * 4, 0, "R3"))
    assert Shape(0, 401, 4, ("R3",)) in dict(supply.counts())
    supply.update("large", ((1000,) * 8, 0, "R3"))
    counts = dict(supply.counts())
    assert counts[Shape(0, 401, 8, ("R3",))] == 1.0
    assert Shape(0, 401, 4, ("R3",)) not in counts


def test_an_unrestricted_pod_leaves_the_last_whole_node_of_a_rare_model() -> None:
    """The policy turns to a node of another model when the rare one's last whole node would
    go, and takes it while more than a few are whole."""
    workload = _restricted_workload(restricted=2, unrestricted=98)
    defragmenter = Defragmenter(workload, GPUSHARE)
    supply = defragmenter.supply
    assert supply is not None
    for i in range(40):
        supply.update(f"common-{i}", ((1000,) + (0,) * 7, 0, "R2"))  # mostly full
    supply.update("rare-0", ((1000,) * 8, 0, "R3"))
    for i in range(1, 6):
        supply.update(f"rare-{i}", ((1000,) * 8, 0, "R3"))
    pod = Shape(0, 1000, 8)
    everything = range(8)
    many_left = defragmenter.growth((1000,) * 8, 0, "R3", pod, everything)
    for i in range(1, 6):
        supply.update(f"rare-{i}", ((1000,) * 7 + (0,), 0, "R3"))
    last = defragmenter.growth((1000,) * 8, 0, "R3", pod, everything)
    common = defragmenter.growth((1000,) * 8, 0, "R2", pod, everything)
    assert last > common  # the last whole R3 node costs more than an R2 node
    assert many_left < last


def test_a_multi_gpu_shape_too_rare_for_the_top_is_still_priced_as_its_last_homes_go() -> None:
    # 8-GPU pods are 2 of 1,000 here, 0.2 % of the pods and about 3 % of the GPU demand: a
    # 97 % coverage leaves them out of the top shapes, so fragmentation never weighs them, yet
    # each needs a whole node. Their last empty nodes are priced all the same (``rare``).
    workload = WorkloadEstimate.of([LIGHT] * 998 + [WHOLE8] * 2, coverage=0.97)
    assert WHOLE8 not in dict(workload.top())
    assert dict(workload.rare()) == {WHOLE8: 2 / 1000}
    supply = Supply(workload)
    for i in range(60):  # 60 nodes, each with one GPU free: ample idle share, no home
        supply.update(f"used{i}", ((0,) * 7 + (16,), 8_000, "A100"))
    supply.update("empty", EMPTY8)
    assert dict(supply.counts())[WHOLE8] == 1.0
    # idle 60 x 16 + 128 units at 4 units a pod: 272 pods to come, 0.54 of them 8-GPU
    assert dict(supply.prices().shapes)[WHOLE8] == rounded(shortage(0.002 * 1088 / 4, 1)) > 0
    for i in range(40):  # plenty of empty nodes: no price
        supply.update(f"more{i}", EMPTY8)
    assert WHOLE8 not in dict(supply.prices().shapes)


def test_rare_shapes_are_only_the_multi_gpu_ones_outside_the_top() -> None:
    single = Shape(cpu=1000, per_gpu=16, count=1)
    workload = WorkloadEstimate.of([LIGHT] * 990 + [single] * 5 + [WHOLE8] * 5, coverage=0.95)
    assert dict(workload.rare()) == {WHOLE8: 5 / 1000}
    covered = WorkloadEstimate.of([LIGHT] * 90 + [WHOLE8] * 10, coverage=1.0)
    assert covered.rare() == ()
