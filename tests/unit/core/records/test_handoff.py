"""The hand-off invariant: Allocate can never serve the wrong pod, whatever kubelet's order."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.records.allocation import Allocation, plan
from gpushare.core.records.handoff import (
    conflict,
    container_signatures,
    listed_signatures,
    pending_of,
    resolve,
)
from gpushare.kube.objects import gpu_node

INTERLEAVINGS = 3000


def pod(name: str, sizes: list[int], core: int | None = None) -> dict[str, Any]:
    containers = []
    for i, size in enumerate(sizes):
        limits: dict[str, Any] = {"aliyun.com/gpu-mem": size}
        if core is not None:
            limits["aliyun.com/gpu-core.percentage"] = core
        containers.append({"name": f"c{i}", "resources": {"limits": limits}})
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"containers": containers},
    }


def handoff_node(gpus: list[int], mode: Mode = Mode.SHARE, marked: bool = True) -> Any:
    node = gpu_node("n", gpus_units=gpus, mode=mode)
    if marked:
        node["metadata"]["annotations"]["gpushare.io/handoff"] = "podresources"
    return read_node(node)


def run_interleaving(rng: random.Random, marked: bool = True) -> tuple[int, int, int]:
    """Bind pods and admit them in a random order; return (served, deferred, mismatches)."""
    core_mode = rng.random() < 0.3
    node = handoff_node(
        [rng.choice([8, 15, 24]) for _ in range(rng.randint(1, 4))],
        Mode.CORE_MEM if core_mode else rng.choice([Mode.SHARE, Mode.CGPU]),
        marked,
    )
    scheduler, ledger = Scheduler(Settings()), Ledger()
    bound: list[Allocation] = []
    served = deferred = mismatches = 0
    for i in range(rng.randint(4, 24)):
        sizes = [rng.choice([1, 2, 2, 3, 4]) for _ in range(rng.choice([1, 1, 1, 2]))]
        spec = pod(f"p{i}", sizes, core=rng.choice([5, 10, 20]) if core_mode else None)
        request = scheduler.read(spec)
        assert isinstance(request, PodRequest)
        booked = scheduler.reserve(request, node, ledger)
        if booked.allocation is not None:
            bound.append(booked.allocation)
        elif any("waiting for pod" in r for r in booked.status.reasons):
            deferred += 1
        # kubelet admits some of the bound-but-unserved pods, in an order of its own
        waiting = [a for a in bound if not ledger.holding(a.uid).assigned]  # type: ignore[union-attr]
        rng.shuffle(waiting)
        for allocation in waiting[: rng.randint(0, len(waiting))]:
            pending = pending_of(ledger.usage(node.name).allocations)
            for container in allocation.containers:
                for mine in container_signatures(allocation, container):
                    answer = resolve(mine.resource, mine.count, pending)
                    if answer.signature is not None and answer.signature != mine:
                        mismatches += 1  # served another pod's GPUs: the predecessor's bug
                    elif answer.signature is None and not marked:
                        mismatches += 1  # ambiguous: a guess would be wrong for someone
            ledger.assume(dataclasses.replace(allocation, assigned=True))
            served += 1
    return served, deferred, mismatches


def test_no_container_is_ever_served_another_pods_gpu() -> None:
    rng = random.Random(20261122)
    totals = [0, 0, 0]
    for _ in range(INTERLEAVINGS):
        for i, value in enumerate(run_interleaving(rng)):
            totals[i] += value
    served, deferred, mismatches = totals
    print(
        f"{INTERLEAVINGS} interleavings: {served} pods served, {deferred} binds deferred, "
        f"{mismatches} mismatches"
    )
    assert mismatches == 0
    assert served > 5 * INTERLEAVINGS and deferred > 0


def test_without_the_invariant_the_same_streams_are_ambiguous() -> None:
    """The control: placing as if no device plugin relied on it makes Allocate ambiguous."""
    rng = random.Random(20261122)
    mismatches = sum(run_interleaving(rng, marked=False)[2] for _ in range(300))
    assert mismatches > 0


def test_same_size_pods_share_the_gpu_when_it_fits() -> None:
    node, ledger, scheduler = handoff_node([15, 15]), Ledger(), Scheduler(Settings())
    first = scheduler.reserve(scheduler.read(pod("a", [3])), node, ledger).allocation  # type: ignore[arg-type]
    second = scheduler.reserve(scheduler.read(pod("b", [3])), node, ledger).allocation  # type: ignore[arg-type]
    assert first is not None and second is not None
    assert first.indexes == second.indexes


def test_bind_is_deferred_when_the_same_size_cannot_share_a_gpu() -> None:
    node, ledger, scheduler = handoff_node([4, 15]), Ledger(), Scheduler(Settings())
    first = scheduler.reserve(scheduler.read(pod("a", [4])), node, ledger).allocation  # type: ignore[arg-type]
    assert first is not None and first.indexes == (0,)
    second = scheduler.reserve(scheduler.read(pod("b", [4])), node, ledger)  # type: ignore[arg-type]
    assert second.allocation is None
    assert "waiting for pod ns/a to start" in second.status.message
    ledger.assume(dataclasses.replace(first, assigned=True))  # the device plugin served it
    third = scheduler.reserve(scheduler.read(pod("b", [4])), node, ledger).allocation  # type: ignore[arg-type]
    assert third is not None and third.indexes == (1,)


def test_nodes_without_the_handoff_marker_are_not_constrained() -> None:
    node = read_node(gpu_node("n", gpus_units=[4, 15]))
    ledger, scheduler = Ledger(), Scheduler(Settings())
    for name in ("a", "b"):
        booked = scheduler.reserve(scheduler.read(pod(name, [4])), node, ledger).allocation  # type: ignore[arg-type]
        assert booked is not None


def test_resolve_refuses_to_guess_and_explains() -> None:
    answer = resolve("mem", 3, [])
    assert (
        answer.signature is None and "no pod bound to this node is waiting" in answer.status.message
    )


def test_conflict_within_one_pod_is_reported() -> None:
    node, scheduler = handoff_node([15, 15]), Scheduler(Settings())
    spec = pod("twin", [4, 4])
    spec["metadata"]["labels"] = {"aliyun.com/gpu-count": "2"}
    request = scheduler.read(spec)
    assert isinstance(request, PodRequest)
    from gpushare.core.records.allocation import plan

    allocation = plan(request, node="n", indexes=[0, 1], unit=node.unit)
    assert conflict(allocation, []) is None


@pytest.mark.parametrize("order", [["a", "b"], ["b", "a"]])
def test_names_path_tells_look_alike_nodes_apart_by_their_pending_pods(order: list[str]) -> None:
    """Same kind and usage, but only node a waits for its device plugin: a defers, b fits."""
    table = NodeTable()
    for name in ("a", "b"):
        obj = gpu_node(name, gpus_units=[4, 15])
        obj["metadata"]["annotations"]["gpushare.io/handoff"] = "podresources"
        table[name] = read_node(obj)
    ledger, scheduler = Ledger(), Scheduler(Settings())
    for name in ("a", "b"):
        booked = scheduler.reserve(
            scheduler.read(pod(f"on-{name}", [4])), table[name], ledger
        ).allocation  # type: ignore[arg-type]
        assert booked is not None and booked.indexes == (0,)
        if name == "b":
            ledger.assume(dataclasses.replace(booked, assigned=True))
    assert table["a"].kind == table["b"].kind
    assert ledger.usage("a").signature == ledger.usage("b").signature
    result = scheduler.filter_names(pod("next", [4]), order, table, ledger)
    assert result.passing == ["b"]
    assert "waiting for pod ns/on-a to start" in result.failed["a"]


def test_kubelet_lists_sidecars_and_regular_containers_but_no_init_container() -> None:
    spec = pod("staged", [2])
    spec["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"limits": {"aliyun.com/gpu-mem": 4}}},
        {
            "name": "proxy",
            "restartPolicy": "Always",
            "resources": {"limits": {"aliyun.com/gpu-mem": 1}},
        },
    ]
    request = Scheduler(Settings()).read(spec)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node="n", indexes=[0], unit=handoff_node([15]).unit)
    assert sorted(listed_signatures(allocation)) == [("c0", "mem"), ("proxy", "mem")]
