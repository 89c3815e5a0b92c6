"""The ledger: rebuild from annotations, terminal pods, assumptions and unplaced holdings."""

from __future__ import annotations

import copy
from typing import Any

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.kube import objects
from gpushare.kube.objects import gpu_pod

TRUST = Trust.sealed(SealKey(b"ledger-test-key-0123456789abcdef"))


def placed(name: str, mem: int, node: str = "n", index: int = 0, **status: Any) -> dict[str, Any]:
    pod = gpu_pod(name, mem=mem)
    pod["metadata"]["uid"] = f"uid-{name}"
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB)
    pod = objects.placed(pod, allocation, trust=TRUST)
    pod["status"] = status
    return pod


def test_rebuild_counts_running_and_frees_finished() -> None:
    pods = [
        placed("a", 3),
        placed("b", 4, index=1),
        placed("done", 5, phase="Succeeded"),
        placed("bad", 6, phase="Failed"),
    ]
    usage = Ledger.from_pods(pods, trust=TRUST).usage("n")
    assert usage.on(0).mem_units == 3 and usage.on(1).mem_units == 4
    assert usage.mem_units == 7


def test_without_a_key_no_annotation_counts() -> None:
    """A ledger nobody gave a key ignores every record: a forgotten key never trusts all."""
    ledger = Ledger.from_pods([placed("a", 3)])
    usage = ledger.usage("n")
    assert usage.gpus == {} and usage.unplaced_mem_units == 3
    assert [i.why.message for i in ledger.ignored()] == [
        "no seal key is configured here to check its seal"
    ]


def test_deleted_pod_frees_its_share() -> None:
    ledger = Ledger.from_pods([placed("a", 3)], trust=TRUST)
    ledger.forget("uid-a")
    assert ledger.usage("n").mem_units == 0 and ledger.nodes() == set()


def test_assumption_survives_a_stale_event_and_yields_to_the_real_one() -> None:
    pod = placed("a", 3)
    stale = copy.deepcopy(pod)
    del stale["metadata"]["annotations"]
    del stale["spec"]["nodeName"]
    ledger = Ledger(trust=TRUST)
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    ledger.assume(plan(request, node="n", indexes=[0], unit=MemoryUnit.GiB))
    ledger.observe(stale)  # an event from before the annotations were written
    assert ledger.usage("n").mem_units == 3 and ledger.is_assumed("uid-a")
    ledger.observe(pod)
    assert ledger.usage("n").mem_units == 3 and not ledger.is_assumed("uid-a")


def test_unassume_is_idempotent() -> None:
    ledger = Ledger()
    ledger.unassume("nobody")
    assert ledger.state() == {}


def test_bound_pod_without_annotations_is_unplaced() -> None:
    pod = gpu_pod("foreign", mem=4, scheduler="default-scheduler")
    pod["metadata"]["uid"] = "f"
    pod["spec"]["nodeName"] = "n"
    usage = Ledger.from_pods([pod]).usage("n")
    assert usage.unplaced_mem_units == 4 and usage.gpus == {}


def test_pending_pod_without_annotations_holds_nothing() -> None:
    pod = gpu_pod("waiting", mem=4)
    assert Ledger.from_pods([pod]).state() == {}
