"""Which unit of a ResourcePolicy is open to a pod now: a pure decision with reasons.

Units are tried in order. A unit holding its ``max`` of the policy's pods is closed. A unit with
room is where the pod goes when one of its nodes can take it (the nodes that passed every other
check, GPU sharing included); when none can, ``whenTryNextUnits`` decides whether the pod waits
for that unit or goes on to the next, as ACK documents it:

- ``LackResourceOrExceedMax`` (the default) goes on;
- ``ExceedMax`` waits for a unit that has a ``max`` (or whose ``podLabels`` ask to wait for
  its node pool to scale out), and goes on past one without;
- ``TimeoutOrExceedMax`` waits as ``ExceedMax`` does until the pod is ``timeout`` old (since it
  was created), then goes on;
- ``LackResourceAndNoTerminating`` goes on, full unit or not, only when none of the policy's
  pods in the unit is terminating: a rolling update's new pods wait for the room its old ones
  are giving back instead of spilling into the next unit.

Counting follows the policy's flags: pods of the same namespace that the selector picks (and
that share the pod's values of ``matchLabelKeys``), bound or being bound, not finished; pods
being deleted are left out with ``ignoreTerminatingPod``, pods older than the policy with
``ignorePreviousPod``. The terminating pods ``LackResourceAndNoTerminating`` waits for are all
the policy's pods in the unit being deleted, whatever their group or age: an old revision's
pods hold the room whichever group they count in. A pod counts in the unit its bind recorded
(``gpushare.io/resource-policy-unit``) while its node still belongs to that unit, else in the
first unit its node belongs to, else in none. The pod being decided is never counted.

What a decision costs and says is bounded whatever the policy holds: nodes are matched to units
through the policy's ``UnitIndex`` (about one look per node and per unit, not one test per unit
and node), and a reason names at most ``SHOWN_UNITS`` passed units and counts the rest, cut at
``explain.MAX_MESSAGE`` (a unit's nodeSelector may be long). Every refused node of a filter
carries that reason, so the reply grows with the nodes kube-scheduler sent, not with the units.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpushare.core.placement.explain import clip
from gpushare.core.resourcepolicies.resourcepolicy import NextPolicy, ResourcePolicy, Unit

ANN_POLICY = "gpushare.io/resource-policy"
"""The policy (``name``) a bind placed the pod under."""
ANN_UNIT = "gpushare.io/resource-policy-unit"
"""The unit's number (from 1) a bind placed the pod in."""
ANN_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""ReplicaSets remove pods of lower cost first; later units get lower costs (``deletion_cost``)."""

SHOWN_UNITS = 3
"""How many passed units a reason or event names; the others are counted."""


@dataclass(frozen=True)
class Placed:
    """What counting needs of one bound (or being bound) pod."""

    uid: str
    namespace: str
    labels: Mapping[str, str]
    node: str
    created: str = ""
    """metadata.creationTimestamp as the API writes it (RFC 3339, UTC, seconds)."""
    terminating: bool = False
    policy: str = ""
    """The policy name its bind recorded, if any."""
    unit: int = 0
    """The unit number its bind recorded, 0 if none."""


@dataclass(frozen=True)
class UnitState:
    """One unit as the decision saw it."""

    unit: Unit
    pods: int
    fitting: int
    """Candidate nodes of this unit that can take the pod."""
    terminating: int = 0
    """The policy's pods in this unit being deleted (of any group, counted or not)."""

    @property
    def full(self) -> bool:
        """Whether the unit holds its ``max``."""
        return self.unit.max_pods is not None and self.pods >= self.unit.max_pods

    def describe(self) -> str:
        """``unit 1 (nodeSelector pool=a) is full: 3/3 pods`` and the like."""
        cap = "no max" if self.unit.max_pods is None else f"max {self.unit.max_pods}"
        if self.full:
            return f"{self.unit.describe()} is full: {self.pods}/{self.unit.max_pods} pods"
        return f"{self.unit.describe()} has {self.pods} pods ({cap}) and no node for this pod now"


@dataclass(frozen=True)
class Gate:
    """The decision: the unit open to the pod (None: none now) and the reason for the rest."""

    policy: str
    chosen: Unit | None
    states: tuple[UnitState, ...]
    reason: str
    """Why a node that could take the pod is refused (every such node outside ``chosen``)."""
    passed: tuple[str, ...] = ()
    """Why each unit before ``chosen`` was passed, in order (for the pod's event)."""
    error: str | None = None
    """Why the policy cannot order this pod at all (the pod is refused everywhere); None when
    it can."""

    def allows(self, node_labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels is open to the pod."""
        return self.error is None and self.chosen is not None and self.chosen.holds(node_labels)


def seconds(timestamp: str) -> float | None:
    """Epoch seconds of an RFC 3339 time, or None when it cannot be read."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def group_of(policy: ResourcePolicy, labels: Mapping[str, str]) -> tuple[str, ...] | None:
    """The pod's values of ``matchLabelKeys``; None when it lacks one of them."""
    values = tuple(labels.get(k) for k in policy.match_label_keys)
    return None if any(v is None for v in values) else tuple(v for v in values if v is not None)


def unit_of(policy: ResourcePolicy, placed: Placed, node_labels: Mapping[str, str]) -> Unit | None:
    """The unit a placed pod counts in (see the module docstring)."""
    if placed.policy == policy.name and 1 <= placed.unit <= len(policy.units):
        recorded = policy.units[placed.unit - 1]
        if recorded.holds(node_labels):
            return recorded
    return policy.index.first_holding(node_labels)


def counts(
    policy: ResourcePolicy,
    *,
    uid: str,
    group: tuple[str, ...],
    placed: Iterable[Placed],
    node_labels: Mapping[str, Mapping[str, str]],
) -> dict[int, int]:
    """Pods per unit number that count against ``max`` for a pod of ``group``."""

    def counted(other: Placed) -> bool:
        if policy.ignore_terminating_pods and other.terminating:
            return False
        if policy.ignore_previous_pods and policy.created and other.created < policy.created:
            return False
        return group_of(policy, other.labels) == group

    return _tally(policy, uid, filter(counted, placed), node_labels)


def terminating(
    policy: ResourcePolicy,
    *,
    uid: str,
    placed: Iterable[Placed],
    node_labels: Mapping[str, Mapping[str, str]],
) -> dict[int, int]:
    """The policy's pods being deleted, per unit number (any group, any age)."""
    return _tally(policy, uid, (p for p in placed if p.terminating), node_labels)


def _tally(
    policy: ResourcePolicy,
    uid: str,
    placed: Iterable[Placed],
    node_labels: Mapping[str, Mapping[str, str]],
) -> dict[int, int]:
    """The policy's pods other than ``uid``, per the unit each counts in."""
    tally = {u.number: 0 for u in policy.units}
    for other in placed:
        if other.uid == uid or not policy.selects(other.namespace, other.labels):
            continue
        unit = unit_of(policy, other, node_labels.get(other.node, {}))
        if unit is not None:
            tally[unit.number] += 1
    return tally


def decide(
    policy: ResourcePolicy,
    *,
    uid: str,
    labels: Mapping[str, str],
    created: str,
    placed: Iterable[Placed],
    node_labels: Mapping[str, Mapping[str, str]],
    fitting: Sequence[str],
    now_s: float,
) -> Gate:
    """The unit open to a pod, given the nodes (``fitting``) that could take it otherwise."""
    group = group_of(policy, labels)
    if group is None:
        missing = [k for k in policy.match_label_keys if k not in labels]
        return Gate(
            policy.key,
            None,
            (),
            "",
            error=clip(
                f"ResourcePolicy {policy.key} counts pods per value of matchLabelKeys "
                f"{list(policy.match_label_keys)}, and this pod has no label {missing[0]!r}: add "
                f"it to the pod (its template) or remove it from spec.matchLabelKeys"
            ),
        )
    placed = list(placed)
    tally = counts(policy, uid=uid, group=group, placed=placed, node_labels=node_labels)
    dying = terminating(policy, uid=uid, placed=placed, node_labels=node_labels)
    fits = Counter(
        unit.number for n in fitting for unit in policy.index.holding(node_labels.get(n, {}))
    )
    states: list[UnitState] = []
    passed: list[str] = []
    for unit in policy.units:
        fit = fits[unit.number]
        state = UnitState(unit, tally[unit.number], fit, dying[unit.number])
        states.append(state)
        if fit and not state.full:
            return _chosen(policy, unit, tuple(states), passed)
        wait = _wait(policy, state, created, now_s)
        if wait is not None:
            # a full unit is waited for with no node open (its nodes would break max)
            chosen = None if state.full else unit
            return Gate(policy.key, chosen, tuple(states), clip(wait), passed=tuple(passed))
        passed.append(_passed(policy, state))
    return Gate(
        policy.key,
        None,
        tuple(states),
        clip(f"ResourcePolicy {policy.key} has no unit open to this pod: {summary(passed)}"),
        passed=tuple(passed),
    )


def summary(passed: Sequence[str]) -> str:
    """Why units were passed, the first ``SHOWN_UNITS`` named and the rest counted."""
    shown = "; ".join(passed[:SHOWN_UNITS])
    rest = len(passed) - SHOWN_UNITS
    if rest <= 0:
        return shown
    return f"{shown}; and {rest} more units, each full or with no node for this pod"


def _chosen(
    policy: ResourcePolicy, unit: Unit, states: tuple[UnitState, ...], passed: list[str]
) -> Gate:
    before = f" ({summary(passed)})" if passed else ""
    reason = (
        f"ResourcePolicy {policy.key} places this pod in {unit.describe()}{before}; later units "
        f"only when it is full or ({policy.next_policy.value}) cannot take the pod"
    )
    return Gate(policy.key, unit, states, clip(reason), passed=tuple(passed))


def _waits_for_room(unit: Unit) -> bool:
    """Whether ``ExceedMax`` and ``TimeoutOrExceedMax`` wait for this unit while it has room."""
    return unit.max_pods is not None or unit.waits_for_scaling


def _waited_s(created: str, now_s: float) -> float:
    born = seconds(created)
    return 0.0 if born is None else max(0.0, now_s - born)


def _then(policy: ResourcePolicy, unit: Unit) -> str:
    last = unit.number == len(policy.units)
    return "(the last unit)" if last else f"before unit {unit.number + 1}"


def _wait(policy: ResourcePolicy, state: UnitState, created: str, now_s: float) -> str | None:
    """Why the pod waits for this unit; None when it may go on (see the module docstring)."""
    unit = state.unit
    head = f"ResourcePolicy {policy.key}: waiting for {unit.describe()}"
    room = (
        f"{state.pods}/{unit.max_pods} pods"
        if unit.max_pods is not None
        else f"{state.pods} pods, no max"
    )
    why = "full" if state.full else "no node for this pod now"
    rule = policy.next_policy
    if rule is NextPolicy.LACK_RESOURCE_AND_NO_TERMINATING:
        if not state.terminating:
            return None
        return (
            f"{head} ({room}, {why}) {_then(policy, unit)}: {state.terminating} of the "
            f"policy's pods there are terminating, and whenTryNextUnits "
            f"LackResourceAndNoTerminating goes on only when none are"
        )
    if state.full or not _waits_for_room(unit):
        return None
    scaling = " (podLabels ask to wait for scaling)" if unit.max_pods is None else ""
    if rule is NextPolicy.EXCEED_MAX:
        return (
            f"{head} ({room}{scaling}, {why}) {_then(policy, unit)}: whenTryNextUnits "
            f"ExceedMax goes on only when a unit with max is full"
        )
    if rule is NextPolicy.TIMEOUT_OR_EXCEED_MAX:
        waited = _waited_s(created, now_s)
        if waited < policy.timeout_s:
            return (
                f"{head} ({room}{scaling}, {why}) {_then(policy, unit)}: "
                f"{policy.timeout_s - waited:.0f}s left of whenTryNextUnits timeout "
                f"{policy.timeout_s:.0f}s"
            )
    return None


def _passed(policy: ResourcePolicy, state: UnitState) -> str:
    """Why the pod went on past this unit."""
    text = state.describe()
    if (
        not state.full
        and policy.next_policy is NextPolicy.TIMEOUT_OR_EXCEED_MAX
        and _waits_for_room(state.unit)
    ):
        text += f", and the pod is older than whenTryNextUnits timeout {policy.timeout_s:.0f}s"
    return text


def deletion_cost(unit: Unit) -> int:
    """The pod-deletion-cost for a pod placed in ``unit``: 0 for the first, -1 for the next...

    ReplicaSets scale in pods of lower cost first, so the last unit empties first; the first
    unit keeps the default cost (0) that pods placed without a policy have.
    """
    return 1 - unit.number
