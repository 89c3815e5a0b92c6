"""Fragmentation-aware extender policies: node and GPU choice, the learned workload, errors."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.config import ConfigError, load
from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.placement.defragmenting import (
    BALANCE_BONUS,
    GPUSHARE,
    Defragmenter,
    WorkloadFeed,
    learned_workload,
)
from gpushare.core.placement.fragmentation import Shape, WorkloadEstimate, fragmentation
from gpushare.core.records.allocation import plan
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import WatchEvent


def pod(name: str, mem: int) -> dict[str, object]:
    obj = gpu_pod(name, mem=mem)
    obj["metadata"]["uid"] = f"uid-{name}"
    return obj


def req(name: str, mem: int) -> PodRequest:
    result = read_pod(pod(name, mem))
    assert isinstance(result, PodRequest)
    return result


def node(name: str, gpus: list[int]) -> NodeInventory:
    return read_node(gpu_node(name, gpus_units=gpus))


def hold(ledger: Ledger, inv: NodeInventory, name: str, mem: int, index: int = 0) -> None:
    ledger.assume(plan(req(name, mem), node=inv.name, indexes=[index], unit=inv.unit))


def scheduler(policy: str, *seen: tuple[str, int]) -> Scheduler:
    result = Scheduler(Settings(policy=policy))
    assert result.workload is not None
    for name, mem in seen:
        result.workload.observe(pod(name, mem))
    return result


WORKLOAD = (("w1", 4), ("w2", 4), ("w3", 4), ("w4", 5))
"""Mostly 4 GiB pods: a GPU left with less than 4 GiB free is a fragment."""


@pytest.mark.parametrize("policy", ["fgd", "gpushare"])
def test_prefers_the_node_that_leaves_no_fragment_where_binpack_fills_the_fuller(
    policy: str,
) -> None:
    full, roomy, ledger = node("full", [15]), node("roomy", [15]), Ledger()
    hold(ledger, full, "a", 9)  # 6 free: a 3 GiB pod would leave 3, too small for 4
    hold(ledger, roomy, "b", 5)  # 10 free: 7 left still takes a 4
    new = pod("new", 3)
    binpack = scheduler("binpack", *WORKLOAD).prioritize(new, [full, roomy], ledger)
    aware = scheduler(policy, *WORKLOAD).prioritize(new, [full, roomy], ledger)
    assert binpack["full"] > binpack["roomy"]
    assert aware == {"full": 0, "roomy": 10}


def test_gpu_choice_is_the_least_growth_then_the_lowest_index() -> None:
    inv, ledger = node("n", [15, 15, 15]), Ledger()
    hold(ledger, inv, "a", 9, 0)  # GPU0: 6 free, a 3 would strand 3
    hold(ledger, inv, "b", 3, 1)  # GPU1: 12 free, 9 left
    hold(ledger, inv, "c", 5, 2)  # GPU2: 10 free, 7 left: as good as GPU1
    for policy in ("gpushare", "fgd"):
        chooser = scheduler(policy, *WORKLOAD)
        assert chooser.verdict(req("new", 3), inv, ledger).gpus == (1,)
    assert scheduler("binpack").verdict(req("new", 3), inv, ledger).gpus == (0,)
    gpushare = scheduler("gpushare", *WORKLOAD)
    booked = gpushare.reserve(req("new", 3), inv, ledger).allocation
    assert booked is not None and booked.indexes == (1,)
    # the tight variant takes the GPU left with less among equal growths
    estimate = WorkloadEstimate.of([Shape(0, 4, 1)] * 3 + [Shape(0, 5, 1)])
    tight = Defragmenter(estimate, replace(GPUSHARE, truncate=False, tight=True))
    assert tight.best_gpu([6, 12, 10], 0, "", Shape(0, 3, 1), [0, 1, 2], 15)[1] == 2
    assert (
        Defragmenter(estimate, GPUSHARE).best_gpu(
            [6, 12, 10], 0, "", Shape(0, 3, 1), [0, 1, 2], 15
        )[1]
        == 1
    )


def test_gpushare_sees_gpus_that_the_node_has_no_cpu_left_for() -> None:
    # Two nodes with two free 15 GiB GPUs; on "b-starved" a CPU-only pod holds 3 of 4 cores.
    # Whole-GPU pods wanting 2 cores are expected: the starved node's GPUs are stranded
    # already, so a 1-core whole-GPU pod is best put there. CPU-blind, both look alike and
    # the first name wins.
    roomy = gpu_node("a-roomy", gpus_units=[15, 15])
    starved = gpu_node("b-starved", gpus_units=[15, 15])
    for obj, cores in ((roomy, "32"), (starved, "4")):
        obj["status"]["allocatable"]["cpu"] = cores
    nodes = [read_node(roomy), read_node(starved)]
    ledger = Ledger()
    busy = gpu_pod("busy", mem=None)
    busy["metadata"]["uid"] = "uid-busy"
    busy["spec"]["nodeName"] = "b-starved"
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}
    ledger.observe(busy)

    def whole(name: str, cpu: str) -> dict[str, object]:
        obj = pod(name, 15)
        obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}  # type: ignore[index]
        return obj

    aware = Scheduler(Settings(policy="gpushare"))
    assert aware.workload is not None
    for i in range(4):
        aware.workload.observe(whole(f"w{i}", "2"))
    new = whole("new", "1")
    assert aware.prioritize(new, nodes, ledger) == {"a-roomy": 0, "b-starved": 10}
    blind = Scheduler(Settings(policy="gpushare"))
    assert blind.workload is not None
    for i in range(4):
        blind.workload.observe(pod(f"w{i}", 15))
    bare = [read_node(gpu_node(n.name, gpus_units=[15, 15])) for n in nodes]
    assert blind.prioritize(pod("new", 15), bare, Ledger()) == {"a-roomy": 10, "b-starved": 9}


def test_balance_prefers_the_node_that_keeps_cpu_for_the_gpus_it_has_left() -> None:
    # Whole-GPU pods of 1 core and of 9 cores (3 to 1), and the 7-core pod being scheduled:
    # 3.8 cores per GPU on average. The 7-core pod leaves "a-tight" (9 cores) one GPU and 2
    # cores, "b-roomy" one GPU and 57 cores. Fragmentation alone likes a-tight a little more
    # (its second GPU never had CPU for the 9-core shape), and a-tight is first by name too;
    # the balance sees that a-tight keeps 2 of the 3.8 cores its GPU is expected to need.
    nodes = []
    for name, cores in (("a-tight", "9"), ("b-roomy", "64")):
        obj = gpu_node(name, gpus_units=[15, 15])
        obj["status"]["allocatable"]["cpu"] = cores
        nodes.append(read_node(obj))

    def whole(name: str, cpu: str) -> dict[str, object]:
        obj = pod(name, 15)
        obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}  # type: ignore[index]
        return obj

    balanced = Scheduler(Settings(policy="gpushare"))
    assert balanced.workload is not None
    for i, cpu in enumerate(("1", "1", "1", "9")):
        balanced.workload.observe(whole(f"w{i}", cpu))
    assert balanced.prioritize(whole("new", "7"), nodes, Ledger()) == {"a-tight": 0, "b-roomy": 10}

    defragmenter = Defragmenter(balanced.workload.estimate, GPUSHARE)
    shape = Shape(cpu=7000, per_gpu=15, count=1)
    parts = {}
    for name, cpu in (("a", 9000), ("b", 64000)):
        growth = defragmenter.growth([15, 15], cpu, "", shape, [0])
        parts[name] = (
            defragmenter.score(growth, 15.0),
            defragmenter.balance([15, 15], cpu, shape, 15.0),
        )
    assert parts["a"][0] > parts["b"][0]  # fragmentation alone: a-tight
    assert parts["a"][1] == pytest.approx(BALANCE_BONUS * 2 / 3.8)
    assert parts["b"][1] == BALANCE_BONUS
    assert sum(parts["a"]) < sum(parts["b"])


def test_balance_reads_the_learned_cpu_per_gpu() -> None:
    # half the pods a whole GPU and 8 cores, half a half GPU and 4: 6 cores per 0.75 GPU
    estimate = WorkloadEstimate.of(
        [Shape(8000, 1000, 1), Shape(4000, 500, 1)] * 5 + [Shape(2000, 0, 0)] * 3, coverage=1.0
    )
    defragmenter = Defragmenter(estimate, GPUSHARE)
    half = Shape(4000, 500, 1)
    # a 2-GPU node left with 1.5 GPUs free needs 12 cores: it keeps 6 of them
    assert defragmenter.balance([1000, 1000], 10_000, half, 1000.0) == pytest.approx(
        BALANCE_BONUS / 2
    )
    assert defragmenter.balance([1000, 1000], 16_000, half, 1000.0) == BALANCE_BONUS
    # a node built with 4 cores per GPU is asked for 4 per GPU left, not the learned 8
    assert defragmenter.balance([1000, 1000], 10_000, half, 1000.0, built=4000) == BALANCE_BONUS
    assert defragmenter.balance([1000, 1000], 7_000, half, 1000.0, built=4000) == pytest.approx(
        BALANCE_BONUS / 2
    )
    # nothing left to feed: the whole bonus, whatever the CPU
    assert defragmenter.balance([500, 0], 4000, half, 1000.0) == BALANCE_BONUS
    assert (
        Defragmenter(estimate, replace(GPUSHARE, balance=False)).balance(
            [1000, 1000], 10_000, half, 1000.0
        )
        == 0.0
    )
    # a workload that asks no CPU (a caller that does not track it) leaves every node equal
    blind = Defragmenter(WorkloadEstimate.of([Shape(0, 500, 1)] * 4), GPUSHARE)
    assert blind.balance([1000, 1000], 0, Shape(0, 500, 1), 1000.0) == BALANCE_BONUS


def test_gpushare_counts_the_two_gpu_pods_a_node_can_still_hold() -> None:
    # two-GPU pods expected: three free GPUs hold one of them and strand the third
    three, four, ledger = node("three", [15] * 4), node("four", [15] * 4), Ledger()
    hold(ledger, three, "a", 15, 0)
    pairs = Scheduler(Settings(policy="gpushare"))
    fgd = Scheduler(Settings(policy="fgd"))
    for i in range(4):
        pair = gpu_pod(f"pair{i}", mem=30, gpu_count="2")
        pair["metadata"]["uid"] = f"uid-pair{i}"
        for chooser in (pairs, fgd):
            assert chooser.workload is not None and chooser.workload.observe(pair)
    new = pod("new", 15)  # one whole GPU
    # on "three" it leaves two GPUs, one pair; on "four" three GPUs, one pair and a stray
    assert pairs.prioritize(new, [three, four], ledger) == {"three": 10, "four": 0}
    # the one-pod test sees a pair fitting either way: equal, the first name wins
    assert fgd.prioritize(new, [three, four], ledger) == {"three": 9, "four": 10}


@pytest.mark.parametrize("policy", ["fgd", "gpushare"])
def test_with_no_pod_seen_it_is_binpack(policy: str) -> None:
    full, roomy, ledger = node("full", [15]), node("roomy", [15, 15]), Ledger()
    hold(ledger, full, "a", 9)
    hold(ledger, roomy, "b", 9, 1)
    binpack = scheduler("binpack")
    aware = scheduler(policy)
    request = req("new", 3)
    for n in (full, roomy):
        assert aware.score(request, n, ledger) == binpack.score(request, n, ledger)
    assert aware.verdict(request, roomy, ledger).gpus == (1,)


def test_the_pod_being_scheduled_is_counted_in_the_workload() -> None:
    """Filtering a pod counts it once, whether or not the cache's watch has shown it yet."""
    roomy, ledger = node("roomy", [15, 15]), Ledger()
    aware = scheduler("gpushare")
    assert aware.workload is not None and aware.workload.seen == 0
    new = pod("new", 3)
    aware.filter(new, [roomy], ledger)
    aware.prioritize(new, [roomy], ledger)
    assert aware.workload.seen == 1
    assert not aware.workload.observe(new)  # the watch's event later changes nothing


def test_feed_counts_each_gpu_pod_once_by_uid() -> None:
    feed = WorkloadFeed()
    assert feed.observe(pod("a", 4)) and not feed.observe(pod("a", 4))
    plain = gpu_pod("plain", mem=None)
    plain["metadata"]["uid"] = "uid-plain"
    assert not feed.observe(plain)  # no GPU memory asked for
    bad = pod("bad", 2)
    bad["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] = "2.5"
    assert not feed.observe(bad)
    feed.observe(pod("b", 4))
    assert feed.seen == 2
    assert [(s.per_gpu, s.count, p) for s, p in feed.workload()] == [(4, 1, 1.0)]


def test_cache_feeds_the_workload_from_list_and_watch() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("n", gpus_units=[15]))
    kube.create_pod(pod("listed", 4))
    kube.create_pod(gpu_pod("cpu-only", mem=None))
    feed = WorkloadFeed()
    cache = ClusterCache(kube, settings=Settings(), workload=feed)
    asyncio.run(cache.sync())
    assert feed.seen == 1
    watched = pod("watched", 6)
    for kind in ("ADDED", "MODIFIED", "MODIFIED"):
        cache.apply_pod(WatchEvent(type=kind, object=watched))  # type: ignore[arg-type]
    cache.apply_pod(WatchEvent(type="MODIFIED", object=pod("listed", 4)))
    assert feed.seen == 2
    cache.apply_pod(WatchEvent(type="DELETED", object=watched))
    assert feed.seen == 2  # the history stays; only the UID is forgotten
    asyncio.run(cache.sync())  # a relist does not count the listed pod again
    assert feed.seen == 2


def test_unknown_policy_names_field_value_and_choices() -> None:
    with pytest.raises(ConfigError) as err:
        load(policy="fgdx")
    assert str(err.value) == (
        "policy='fgdx': policy='fgdx' is not known; choose one of: binpack, fgd, gpushare, spread"
    )
    with pytest.raises(ValueError, match="policy='fgdx' is not known; choose one of: binpack"):
        Scheduler(Settings(policy="fgdx"))


@pytest.mark.parametrize("refresh", [100, 2])
@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "gpushare"])
def test_names_view_answers_as_the_node_by_node_filter(policy: str, refresh: int) -> None:
    """The extender's fast path (decisions by name over change logs) never disagrees.

    ``refresh=2`` changes the workload every few pods, so decisions are re-made by group.
    """
    rng = random.Random(5)

    def made(i: int) -> NodeInventory:
        obj = gpu_node(f"n{i}", gpus_units=[15, 15] if i % 2 else [24])
        if i in (0, 3):  # look-alikes of n2/n4 and n1/n5 whose pending pods matter
            obj["metadata"]["annotations"]["gpushare.io/handoff"] = "podresources"
        return read_node(obj)

    table = NodeTable((f"n{i}", made(i)) for i in range(8))
    names = [*table, "ghost"]
    ledger = Ledger()
    fast, slow = (
        Scheduler(
            Settings(policy=policy),
            workload=WorkloadFeed(estimate=WorkloadEstimate(refresh=refresh)),
        )
        for _ in range(2)
    )
    for step in range(60):
        new = pod(f"p{step}", rng.choice([2, 3, 5, 8, 12]))
        for s in (fast, slow):
            assert s.workload is not None
            s.workload.observe(new)
        result = fast.filter_names(new, names, table, ledger)
        verdicts = slow.filter(new, table.values(), ledger).verdicts
        assert result.passing == [v.node for v in verdicts if v.fits]
        assert result.failed == {v.node: v.message for v in verdicts if v.status.may_pass_later}
        assert result.missing == ["ghost"]
        scores = fast.prioritize_names(new, result.passing, table, ledger)
        passing = [table[n] for n in result.passing]
        assert scores == list(slow.prioritize(new, passing, ledger).values())
        if result.passing:
            request = read_pod(new)
            assert isinstance(request, PodRequest)
            booked = slow.reserve(request, table[result.passing[0]], ledger).allocation
            assert booked is not None
        if step % 7 == 6:  # a node is replaced, as a watch event would
            table["n1"] = node("n1", [15, 15])
            table["n3"] = made(3)
        if step % 11 == 10:
            ledger.forget(f"uid-p{step - 5}")


def test_pods_of_one_gpu_shape_with_other_cpu_requests_do_not_share_cached_decisions() -> None:
    """The policy reads the pod's CPU request: the decision cache must key by it, for names and
    for node lists, or a pod is scored with the CPU of an earlier look-alike."""
    table, ledger = NodeTable(), Ledger()
    for i, cpu in enumerate(("8", "8", "16", "16")):
        obj = gpu_node(f"n{i}", gpus_units=[15, 15])
        obj["status"]["allocatable"]["cpu"] = cpu
        table[f"n{i}"] = read_node(obj)

    def cpu_pod(name: str, mem: int, cpu: str, count: str = "1") -> dict[str, object]:
        obj = gpu_pod(name, mem=mem * int(count), gpu_count=count)
        obj["metadata"]["uid"] = f"uid-{name}"
        obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
        return obj

    feed = WorkloadFeed()
    for i in range(20):  # the target workload: pods that need 6 CPUs with their 7 GiB
        feed.observe(cpu_pod(f"w{i}", 7, "6"))
    cached = Scheduler(Settings(policy="gpushare"), workload=feed)
    for i, (name, cpu) in enumerate((("a", "2"), ("b", "0"), ("c", "3"), ("d", "1"))):
        host = cpu_pod(f"host{i}", 1, cpu)
        host["spec"]["nodeName"] = f"n{i}"
        ledger.observe(host)
        for probe_cpu in ("1", "5", "1", "7"):
            probe = cpu_pod(f"{name}-{probe_cpu}", 4, probe_cpu)
            names = sorted(table)
            passing = cached.filter_names(probe, names, table, ledger).passing
            fresh = Scheduler(Settings(policy="gpushare"), workload=feed)
            want = fresh.prioritize(probe, [table[n] for n in passing], ledger)
            got = cached.prioritize_names(probe, passing, table, ledger)
            assert dict(zip(passing, got, strict=True)) == want, (name, probe_cpu)
            assert cached.prioritize(probe, [table[n] for n in passing], ledger) == want


def test_the_learned_workload_follows_the_first_pods_without_waiting_for_a_hundred() -> None:
    """On a small cluster the first hundred pods are a third of it: one shape must not rule."""
    estimate = learned_workload()
    heavy, light = Shape(16_000, 1000, 1), Shape(2_000, 470, 1)
    estimate.observe(heavy)
    assert estimate.top() == ((heavy, 1.0),)
    for _ in range(3):
        estimate.observe(light)
    assert dict(estimate.top()) == {light: 0.75, heavy: 0.25}
    versions = estimate.version
    for _ in range(400):
        estimate.observe(light)
    assert estimate.version - versions < 30  # then every quarter of the pods seen
    assert WorkloadFeed().estimate.refresh == estimate.refresh == 1


def _reference_best_gpu(
    defragmenter: Defragmenter,
    free: list[int],
    cpu: int,
    shape: Shape,
    candidates: list[int],
    scale: float,
) -> tuple[float, int]:
    """The GPU loop over every candidate and position, nothing remembered: what the
    remembered answer must equal."""

    def value(shares: list[int], cpu_left: int) -> float:
        key = (tuple(sorted(shares)), cpu_left, "")
        held = defragmenter.prices.held(*key)
        top = defragmenter.workload.top()
        return fragmentation(*key, top, copies=defragmenter.variant.copies) - held

    before = value(free, cpu)
    best: tuple[float, float, int] | None = None
    best_growth = best_bonus = 0.0
    for order, position in enumerate(candidates):
        after = list(free)
        after[position] -= shape.per_gpu
        growth = value(after, cpu - shape.cpu) - before
        variant = defragmenter.variant
        bonus = defragmenter.bonus(shape, free[position], scale)
        if variant.truncate or variant.pairing:
            rank = -(defragmenter.score(growth, scale) + bonus)
        else:
            rank = growth
        key = (rank, after[position] if variant.tight else 0, order)
        if best is None or key < best:
            best, best_growth, best_bonus = key, growth, bonus
    assert best is not None
    return defragmenter.score(best_growth, scale) + best_bonus, candidates[best[2]]


@given(
    nodes=st.lists(
        st.tuples(
            st.lists(st.integers(0, 15), min_size=1, max_size=8),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=12,
    ),
    per_gpu=st.integers(1, 15),
    tight=st.booleans(),
    truncate=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_remembered_gpu_choices_and_growths_equal_the_full_loop(
    nodes: list[tuple[list[int], int]], per_gpu: int, tight: bool, truncate: bool
) -> None:
    # Nodes in the same state share an answer; GPU order and ties must still come out as the
    # loop over positions gives them, whatever was asked before.
    estimate = WorkloadEstimate.of([Shape(1, 4, 1)] * 3 + [Shape(2, 6, 1), Shape(1, 15, 2)])
    defragmenter = Defragmenter(
        estimate, replace(GPUSHARE, truncate=truncate, tight=tight, scarcity=False)
    )
    shape = Shape(1, per_gpu, 1)
    asked = nodes + [(free[::-1], cpu) for free, cpu in nodes] + nodes
    for free, cpu in asked:  # the same states again, in other GPU orders, then as before
        candidates = [g for g, share in enumerate(free) if share >= per_gpu]
        if candidates:
            got = defragmenter.best_gpu(free, cpu, "", shape, candidates, 15)
            assert got == _reference_best_gpu(defragmenter, free, cpu, shape, candidates, 15)
        whole = [g for g, share in enumerate(free) if share == 15][:2]
        if len(whole) == 2:
            two = Shape(1, 15, 2)
            direct = list(free)
            for g in whole:
                direct[g] = 0
            top = estimate.top()
            expected = fragmentation(
                tuple(sorted(direct)), cpu - 1, "", top, copies=True
            ) - fragmentation(tuple(sorted(free)), cpu, "", top, copies=True)
            assert defragmenter.growth(free, cpu, "", two, whole) == pytest.approx(expected)
