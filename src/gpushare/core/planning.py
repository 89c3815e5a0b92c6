"""Planning ahead: the node a pending pod is expected to go to, given to kube-scheduler as a hint.

kube-scheduler tries a pod's ``status.nominatedNodeName`` before anything else
(``findNodesThatFitPod`` then ``evaluateNominatedNode``, pkg/scheduler/schedule_one.go in
v1.36.3): it runs its filters and the extenders on that one node, and when the node passes it
takes it without filtering the others or scoring. Since v1.35 components other than
kube-scheduler may set it to say where a pod is expected to land (the
``NominatedNodeNameForExpectation`` gate, beta, on by default); the API server clears it when
the pod is bound (``ClearingNominatedNodeNameAfterBinding``, beta, on by default, in the pod
binding storage). When the node no longer passes, kube-scheduler searches every node as usual.

So the extender can do the search itself ahead of kube-scheduler, pod by pod, in the order
kube-scheduler's queue takes them, booking each plan as the pod's intent (``core.ledger``), and
kube-scheduler's per-pod cost falls to one node. The hint is never trusted: kube-scheduler's
filters and the extender's filter check the nominated node again, and bind checks it once more.

This module holds what decides whether a pod may be planned, the node facts kube-scheduler's
own filters read that the plan must respect (labels, taints, ``spec.unschedulable``), and the
queue order. What it cannot see (CPU and memory left on a node, host ports) costs at worst a
full search for that pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core.kubejson import (
    KubeObject,
    labels_of,
    meta,
    name_of,
    namespace_of,
    pod_spec_of,
    spec_of,
    status_of,
)
from gpushare.core.preferences import REQUIRED, requirement_matches

HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects kube-scheduler's TaintToleration filter refuses untolerated."""

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint NodeUnschedulable reads a toleration of, for a node with ``spec.unschedulable``."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class NodeFacts:
    """What kube-scheduler's filters read of a node that a plan can check beforehand."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    """Its ``NoSchedule`` and ``NoExecute`` taints."""
    unschedulable: bool

    @classmethod
    def of(cls, node: KubeObject) -> NodeFacts:
        spec = spec_of(node)
        taints = tuple(
            _mapping(t)
            for t in _list(spec.get("taints"))
            if _mapping(t).get("effect") in HARD_EFFECTS
        )
        return cls(name_of(node), dict(labels_of(node)), taints, bool(spec.get("unschedulable")))


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``: effect, key and value as kube-scheduler reads them."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _affinity_terms(pod: KubeObject) -> list[Mapping[str, Any]]:
    affinity = _mapping(_mapping(pod_spec_of(pod).get("affinity")).get("nodeAffinity"))
    return [_mapping(t) for t in _list(_mapping(affinity.get(REQUIRED)).get("nodeSelectorTerms"))]


def _term_admits(term: Mapping[str, Any], node: NodeFacts) -> bool:
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    if not all(requirement_matches(_mapping(e), node.labels) for e in expressions):
        return False
    by_field = {"metadata.name": node.name}
    return all(requirement_matches(_mapping(f), by_field) for f in fields)


def admits(node: NodeFacts, pod: KubeObject) -> bool:
    """Whether kube-scheduler's label, affinity, taint and cordon filters let the pod onto it."""
    spec = pod_spec_of(pod)
    tolerations = [_mapping(t) for t in _list(_mapping(spec).get("tolerations"))]
    if node.unschedulable:
        cordon = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
        if not any(tolerates(t, cordon) for t in tolerations):
            return False
    for taint in node.taints:
        if not any(tolerates(t, taint) for t in tolerations):
            return False
    for key, value in _mapping(spec.get("nodeSelector")).items():
        if node.labels.get(key) != value:
            return False
    terms = _affinity_terms(pod)
    return not terms or any(_term_admits(t, node) for t in terms)


def nominated_node_of(pod: KubeObject) -> str:
    """``status.nominatedNodeName``, or an empty string."""
    return str(status_of(pod).get("nominatedNodeName") or "")


def queue_order(pod: KubeObject) -> tuple[int, str, str, str]:
    """kube-scheduler's queue order as far as the pod shows it: higher priority first, then
    older (``PrioritySort``); creation time has a second's grain, so namespace and name break
    ties the way kube-scheduler's first list of pending pods (in key order) does."""
    priority = pod_spec_of(pod).get("priority")
    created = str(meta(pod).get("creationTimestamp") or "")
    rank = -priority if isinstance(priority, int) else 0
    return (rank, created, namespace_of(pod), name_of(pod))
