"""A bind for a pod that is already bound: succeed, or say why, and never write."""

from __future__ import annotations

from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.status import Code
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan, to_annotations
from gpushare.core.records.binding import already_bound
from gpushare.kube.objects import gpu_pod


def bound_pod(node: str, *, annotated_for: str = "") -> dict[str, object]:
    pod = gpu_pod("a", mem=3)
    pod["metadata"]["uid"] = "uid-a"
    pod["spec"]["nodeName"] = node
    if annotated_for:
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        allocation = plan(request, node=annotated_for, indexes=[0], unit=MemoryUnit.GiB)
        pod["metadata"]["annotations"] = to_annotations(allocation, dev_units=15)
    return pod


def test_bound_where_asked_with_its_allocation_is_done() -> None:
    assert (
        already_bound(bound_pod("n1", annotated_for="n1"), node="n1", wants_gpu=True).code
        is Code.SKIP
    )


def test_a_pod_without_gpu_bound_where_asked_is_done() -> None:
    assert already_bound(bound_pod("n1"), node="n1", wants_gpu=False).code is Code.SKIP


def test_bound_elsewhere_names_both_nodes() -> None:
    reason = already_bound(bound_pod("n1", annotated_for="n1"), node="n2", wants_gpu=True).message
    assert "pod default/a is already bound to node n1, not n2" in reason


def test_bound_without_an_allocation_for_its_node_says_what_to_do() -> None:
    for pod in (bound_pod("n1"), bound_pod("n1", annotated_for="n2")):
        reason = already_bound(pod, node="n1", wants_gpu=True).message
        assert "without a gpushare allocation" in reason and "delete the pod" in reason
