"""What a plan must respect of kube-scheduler's own filters, and its queue order."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.planning import NodeFacts, admits, nominated_node_of, queue_order, tolerates
from gpushare.kube.objects import gpu_node, gpu_pod


def node(**spec: Any) -> NodeFacts:
    raw = gpu_node("n1", gpus_units=[15])
    labels = spec.pop("labels", {})
    raw["metadata"].setdefault("labels", {}).update(labels)
    raw.setdefault("spec", {}).update(spec)
    return NodeFacts.of(raw)


def pod(**spec: Any) -> dict[str, Any]:
    raw = gpu_pod("p", mem=3)
    raw["spec"].update(spec)
    return raw


TAINT = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "a100"}, True),  # Equal by default; any effect
        ({"key": "gpu", "value": "t4"}, False),
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"operator": "Equal", "value": "a100"}, False),  # an empty key needs Exists
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "Gt", "value": "1"}, False),
    ],
)
def test_a_toleration_tolerates_a_taint_as_kube_scheduler_reads_it(
    toleration: dict[str, str], expected: bool
) -> None:
    assert tolerates(toleration, TAINT) is expected


def test_only_hard_taints_are_kept_and_they_need_a_toleration() -> None:
    soft = {"key": "x", "effect": "PreferNoSchedule"}
    facts = node(taints=[TAINT, soft])
    assert facts.taints == (TAINT,)
    assert not admits(facts, pod())
    assert admits(facts, pod(tolerations=[{"key": "gpu", "operator": "Exists"}]))
    assert admits(node(taints=[soft]), pod())


def test_a_cordoned_node_admits_only_pods_that_tolerate_the_cordon() -> None:
    cordoned = node(unschedulable=True)
    assert not admits(cordoned, pod())
    cordon = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    assert admits(cordoned, pod(tolerations=[cordon]))


def test_node_selector_and_required_node_affinity_are_matched_against_labels() -> None:
    facts = node(labels={"zone": "a", "gpu": "t4"})
    assert admits(facts, pod(nodeSelector={"zone": "a"}))
    assert not admits(facts, pod(nodeSelector={"zone": "b"}))

    def required(*terms: dict[str, Any]) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }

    t4 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["t4"]}]}
    a100 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    other = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    assert admits(facts, pod(affinity=required(t4)))
    assert not admits(facts, pod(affinity=required(a100)))
    assert admits(facts, pod(affinity=required(a100, t4)))  # terms are ORed
    assert admits(facts, pod(affinity=required(by_name)))
    assert not admits(facts, pod(affinity=required(other)))
    assert not admits(facts, pod(affinity=required({})))  # an empty term matches no node


def test_queue_order_is_priority_then_age_then_key() -> None:
    def at(name: str, created: str, priority: int | None = None) -> dict[str, Any]:
        raw = gpu_pod(name, mem=1)
        raw["metadata"]["creationTimestamp"] = created
        if priority is not None:
            raw["spec"]["priority"] = priority
        return raw

    pods = [
        at("b", "2026-01-01T00:00:01Z"),
        at("a", "2026-01-01T00:00:01Z"),
        at("z", "2026-01-01T00:00:00Z"),
        at("late-but-urgent", "2026-01-01T00:00:09Z", priority=1000),
    ]
    ordered = [p["metadata"]["name"] for p in sorted(pods, key=queue_order)]
    assert ordered == ["late-but-urgent", "z", "a", "b"]


def test_the_nominated_node_is_read_from_the_status() -> None:
    raw = gpu_pod("p", mem=1)
    assert nominated_node_of(raw) == ""
    raw["status"] = {"nominatedNodeName": "n3"}
    assert nominated_node_of(raw) == "n3"
