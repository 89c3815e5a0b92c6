"""Whether kube-scheduler's own scores could prefer one of the extender's nodes to another.

In the GPU profile (``schedconfig.packing_profile``) the score plugins that rank nodes by
their fill or images are off, and what is left scores only what a pod or a node states:

- NodeAffinity: the pod's ``preferredDuringSchedulingIgnoredDuringExecution`` node terms
  (``NodeAffinity.PreScore`` skips a pod without them);
- InterPodAffinity: the pod's preferred pod (anti-)affinity terms, and the terms of pods already
  placed that match it: their required and preferred affinity and their preferred
  anti-affinity (``InterPodAffinity.PreScore`` and ``processExistingPod``);
- PodTopologySpread: the pod's ``ScheduleAnyway`` constraints (the profile adds no system
  default ones);
- TaintToleration: ``PreferNoSchedule`` taints on the nodes;
- DynamicResources (claims, with a prioritized list) and VolumeBinding (volumes, with the
  StorageCapacityScoring gate).

(pkg/scheduler/framework/plugins in k8s.io/kubernetes v1.36.) When none of them applies, every
node kube-scheduler's filters kept scores the same with it, the extender's top node wins
(``EXTENDER_WEIGHT``), and the extender may answer the filter with that node alone, which makes
kube-scheduler skip scoring and the prioritize call (``len(feasibleNodes) == 1`` in
``schedulePod``, pkg/scheduler/schedule_one.go). Whatever is unsure counts as a preference: a
term whose namespaces are chosen by labels, or a selector this module cannot read, may match.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core.booking.ledger import is_terminal
from gpushare.core.model.kubejson import (
    CLAIM_VOLUMES,
    KubeObject,
    labels_of,
    namespace_of,
    node_name_of,
    pod_spec_of,
    spec_of,
    uid_of,
)

PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def stated_preference(pod: KubeObject) -> str:
    """What in the pod kube-scheduler scores per node, in words; empty when nothing."""
    spec = pod_spec_of(pod)
    affinity = _mapping(spec.get("affinity"))
    if _list(_mapping(affinity.get("nodeAffinity")).get(PREFERRED)):
        return "preferred node affinity"
    for kind in ("podAffinity", "podAntiAffinity"):
        if _list(_mapping(affinity.get(kind)).get(PREFERRED)):
            return f"preferred {kind}"
    for constraint in _list(spec.get("topologySpreadConstraints")):
        if _mapping(constraint).get("whenUnsatisfiable") == "ScheduleAnyway":
            return "topologySpreadConstraints with ScheduleAnyway"
    if _list(spec.get("resourceClaims")):
        return "resourceClaims"
    for volume in _list(spec.get("volumes")):
        if CLAIM_VOLUMES & set(_mapping(volume)):
            return "persistent volumes"
    return ""


def has_prefer_no_schedule_taint(node: KubeObject) -> bool:
    """Whether the node carries a ``PreferNoSchedule`` taint (TaintToleration scores it)."""
    return any(
        _mapping(taint).get("effect") == "PreferNoSchedule"
        for taint in _list(spec_of(node).get("taints"))
    )


def _requirement_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = expression.get("key")
    operator = expression.get("operator")
    values = {str(v) for v in _list(expression.get("values"))}
    if not isinstance(key, str):
        return True  # unreadable: may match
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return True  # an operator this module does not know: may match


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels: null matches nothing, ``{}`` everything (as
    ``metav1.LabelSelectorAsSelector`` reads it for pod affinity terms)."""
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        return True
    for key, value in _mapping(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    return all(
        _requirement_matches(_mapping(expression), labels)
        for expression in _list(selector.get("matchExpressions"))
    )


@dataclass(frozen=True)
class Term:
    """A placed pod's pod-affinity term that scores nodes for the pods it matches."""

    namespaces: frozenset[str] | None
    """The namespaces it looks at; None when a namespaceSelector chooses them (any may)."""
    selector: Any

    def matches(self, pod: KubeObject) -> bool:
        if self.namespaces is not None and namespace_of(pod) not in self.namespaces:
            return False
        return selector_matches(self.selector, labels_of(pod))


def scoring_terms(pod: KubeObject) -> tuple[Term, ...]:
    """The terms of a placed pod that InterPodAffinity weighs for other pods: required and
    preferred affinity, preferred anti-affinity (required anti-affinity only filters)."""
    affinity = _mapping(pod_spec_of(pod).get("affinity"))
    raw: list[Any] = []
    pod_affinity = _mapping(affinity.get("podAffinity"))
    raw.extend(_list(pod_affinity.get(REQUIRED)))
    for kind in (pod_affinity, _mapping(affinity.get("podAntiAffinity"))):
        raw.extend(_mapping(w).get("podAffinityTerm") for w in _list(kind.get(PREFERRED)))
    own = namespace_of(pod)
    terms = []
    for entry in raw:
        term = _mapping(entry)
        names = {str(n) for n in _list(term.get("namespaces"))}
        chosen_by_labels = term.get("namespaceSelector") is not None
        namespaces = None if chosen_by_labels else frozenset(names or {own})
        terms.append(Term(namespaces, term.get("labelSelector")))
    return tuple(terms)


class PlacedTerms:
    """The scoring pod-affinity terms of the pods on nodes, by pod UID, kept from the watch.

    kube-scheduler weighs only pods already on a node (its snapshot's node infos); a pending
    pod's terms count once the watch shows it bound.
    """

    def __init__(self, pods: Iterable[KubeObject] = ()) -> None:
        self._terms: dict[str, tuple[Term, ...]] = {}
        for pod in pods:
            self.observe(pod)

    def observe(self, pod: KubeObject) -> None:
        """Take in a pod as listed or watched: placed and unfinished, its terms count."""
        uid = uid_of(pod)
        terms = scoring_terms(pod) if node_name_of(pod) and not is_terminal(pod) else ()
        if terms:
            self._terms[uid] = terms
        else:
            self._terms.pop(uid, None)

    def forget(self, uid: str) -> None:
        self._terms.pop(uid, None)

    def __len__(self) -> int:
        return len(self._terms)

    def matching(self, pod: KubeObject) -> bool:
        """Whether some placed pod's term matches ``pod`` (its score then differs by node)."""
        return any(term.matches(pod) for terms in self._terms.values() for term in terms)
