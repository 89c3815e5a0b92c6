"""ResourcePolicy as a scheduling plugin: filter, reserve (with its annotations and labels),
unreserve, over the ``PolicyBook``.

kube-scheduler's framework splits a plugin that holds state into Filter (may the pod go to the
node?), Reserve (hold what the pod takes there before anything is written) and Unreserve (give
it back when the bind fails; idempotent). ResourcePolicy holds state too, each unit's count of
placed pods, so it has the same three steps, here beside its decision
(``core.resourcepolicies.gating``) and its
bookkeeping (``core.resourcepolicies.policybook``) rather than in the extender:

- ``filter_units``: keep only the fitting nodes of the unit the policy opens to the pod;
- ``reserve_unit``: check the bind's node again and assume the pod in its unit, with no
  ``await`` before the caller's booking, so two binds cannot both take a unit's last place;
  the result carries what the bind writes on the pod (the unit's annotations and
  ``podLabels``, the policy and unit numbers, the deletion cost), or the refusal as a
  ``Status`` (``core.model.status``);
- ``unreserve_unit``: drop that assumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare.core.model.kubejson import KubeObject, key_of
from gpushare.core.model.status import SUCCESS, Code, Status, refused
from gpushare.core.resourcepolicies.gating import (
    ANN_DELETION_COST,
    ANN_POLICY,
    ANN_UNIT,
    Gate,
    deletion_cost,
)
from gpushare.core.resourcepolicies.policybook import PolicyBook


def filter_units(
    book: PolicyBook | None,
    pod: KubeObject,
    passing: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    node_labels: Mapping[str, Mapping[str, str]],
    *,
    now_s: float,
) -> list[str]:
    """Keep only the passing nodes of the unit a ResourcePolicy opens to the pod.

    A node refused here gets the gate's reason: unresolvable when the policy cannot order
    the pod at all (fixing the policy or the pod is the way out), else unschedulable.
    """
    if book is None:
        return passing
    gate = book.gate(pod, fitting=passing, now_s=now_s)
    if gate is None:
        return passing
    if gate.error is not None:
        for name in passing:
            unresolvable[name] = gate.error
        return []
    kept = []
    for name in passing:
        if gate.allows(node_labels.get(name, {})):
            kept.append(name)
        else:
            failed[name] = gate.reason
    return kept


SOURCE = "ResourcePolicy"
"""Who the plugin's statuses say decided."""


@dataclass(frozen=True)
class UnitReservation:
    """The pod's unit, assumed, and what the bind writes on the pod for it; or, when
    ``status`` is not ok, why the bind may not place the pod on its node: ``INVALID`` when the
    pod or its policy is invalid, ``UNSCHEDULABLE`` when only its unit is closed there now."""

    gate: Gate | None
    """None: no policy orders the pod (nothing assumed, nothing to write)."""
    annotations: dict[str, str | None] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    status: Status = SUCCESS


def reserve_unit(
    book: PolicyBook | None, pod: KubeObject, node: str, *, now_s: float
) -> UnitReservation:
    """The ResourcePolicy unit ``node`` places the pod in, assumed; or the bind's refusal.

    Checked again at bind because kube-scheduler binds while it filters the next pod: two
    pods filtered against one free place both pass, and only this check, with the
    assumption that follows it, lets one of them have it.
    """
    if book is None:
        return UnitReservation(None)
    gate = book.gate(pod, fitting=[node], now_s=now_s)
    if gate is None:
        return UnitReservation(None)
    key = key_of(pod)
    if gate.error is not None:
        return UnitReservation(
            gate, status=refused(Code.INVALID, f"pod {key}: {gate.error}", SOURCE)
        )
    if not gate.allows(book.node_labels.get(node, {})):
        why = f"pod {key} may not go to node {node} now: {gate.reason}"
        return UnitReservation(gate, status=refused(Code.UNSCHEDULABLE, why, SOURCE))
    if gate.chosen is None:
        return UnitReservation(gate)
    book.assume(book.placement(pod, node, gate))
    unit = gate.chosen
    annotations: dict[str, str | None] = dict(unit.pod_annotations)
    annotations[ANN_POLICY] = gate.policy.split("/", 1)[1]
    annotations[ANN_UNIT] = str(unit.number)
    annotations[ANN_DELETION_COST] = str(deletion_cost(unit))
    return UnitReservation(gate, annotations, dict(unit.pod_labels))


def unreserve_unit(book: PolicyBook | None, uid: str) -> None:
    """Drop a bind's unit assumption (its bind failed, or its pod no longer fits); idempotent."""
    if book is not None:
        book.unassume(uid)
