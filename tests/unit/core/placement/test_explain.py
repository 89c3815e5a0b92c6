"""Placement and refusal sentences (core.placement.explain): what Events and --explain say."""

from __future__ import annotations

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.explain import (
    IN_CLUSTER,
    MAX_MESSAGE,
    placement_message,
    refusal_summary,
)
from gpushare.core.records.allocation import plan
from gpushare.kube.objects import gpu_node, gpu_pod


def booked(mem: int, *, core: int | None = None, count: str | None = None, gpus: list[int]) -> str:
    node = read_node(
        gpu_node("node-a", gpus_units=[15, 15], mode=Mode.CORE_MEM if core else Mode.SHARE)
    )
    ledger = Ledger()
    other = read_pod(
        {
            **gpu_pod("other", mem=2, core=10 if core else None),
            "metadata": {"name": "other", "namespace": "d", "uid": "o"},
        }
    )
    assert isinstance(other, PodRequest)
    ledger.assume(plan(other, node="node-a", indexes=[gpus[0]], unit=MemoryUnit.GiB))
    pod = gpu_pod("p", mem=mem, core=core, gpu_count=count)
    pod["metadata"]["uid"] = "u"
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node="node-a", indexes=gpus, unit=MemoryUnit.GiB)
    ledger.assume(allocation)
    return placement_message(allocation, node, ledger.usage("node-a"))


def test_placement_names_gpu_node_and_fill_after_booking() -> None:
    assert booked(3, gpus=[1]) == "GPU1 on node-a, 5/15 GiB"


def test_placement_adds_computing_power_on_core_mem() -> None:
    assert booked(3, core=30, gpus=[0]) == "GPU0 on node-a, 5/15 GiB, 40/100% computing power"


def test_placement_over_two_gpus_lists_each() -> None:
    assert booked(6, count="2", gpus=[0, 1]) == "GPU0+GPU1 on node-a: GPU0 5/15 GiB; GPU1 3/15 GiB"


def test_refusals_are_counted_per_reason_most_frequent_first() -> None:
    reasons = ["GPU0: 2/15 GiB free < 3 GiB requested"] * 8 + ["node is not shared"] * 4
    assert refusal_summary(reasons, 12) == (
        "0/12 nodes kube-scheduler asked gpushare about fit: "
        "8 × GPU0: 2/15 GiB free < 3 GiB requested; 4 × node is not shared"
    )


def test_refusals_past_five_reasons_are_counted_and_clipped() -> None:
    reasons = [f"reason {i}" for i in range(8)] + ["reason 0"]
    text = refusal_summary(reasons, 9)
    assert text.startswith("0/9 nodes kube-scheduler asked gpushare about fit: 2 × reason 0")
    assert text.endswith("3 node(s) for 3 other reason(s)")
    long = refusal_summary(["x" * 400 + str(i) for i in range(5)], 5)
    assert refusal_summary(["r"], 3, IN_CLUSTER) == (
        "0/3 nodes in the cluster pass gpushare's checks: 1 × r"
    )
    assert len(long) == MAX_MESSAGE and long.endswith("…")
