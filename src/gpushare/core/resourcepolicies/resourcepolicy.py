"""ResourcePolicy (``scheduling.alibabacloud.com/v1alpha1``): the spec, read and checked.

A ResourcePolicy names, by pod labels in its own namespace, the pods it orders, and lists
*units*: node pools (by ``nodeSelector``) tried in order, each holding at most ``max`` of those
pods. ACK's scheduler also offers units of virtual capacity (``resource: eci``, ``elastic``,
``acs``); gpushare places pods only on the cluster's own nodes, so such a unit makes the whole
policy invalid rather than being skipped: a pod that its author meant to overflow into ECI
would otherwise wait forever with no word of why. The CRD refuses those values when the policy
is applied (``gpushare.crds``); ``read_policy`` refuses them again for a policy stored before
that CRD was installed, and the extender says so on every pod the policy selects.

A policy lists at most ``MAX_UNITS`` units. The CRD says so (``maxItems``), and reading says so
again for a policy stored before that CRD was installed: what a filter costs and how long its
reply is must not grow with what one namespace writes into one object (``UnitIndex`` and
``core.resourcepolicies.gating`` keep each filter's work near one look per node and per unit, and
its reasons
short, within that limit too).

Reading is a pure function from the object's JSON to a ``ResourcePolicy`` or an
``InvalidResourcePolicy`` whose message names the field, the value, the rule and what to do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from gpushare.core.model.kubejson import KubeObject, meta, name_of, namespace_of, spec_of
from gpushare.core.placement.explain import clip

GROUP = "scheduling.alibabacloud.com"
VERSION = "v1alpha1"
KIND = "ResourcePolicy"
PLURAL = "resourcepolicies"

SERVED_RESOURCES = ("ecs",)
"""Unit kinds gpushare places pods on: the cluster's own nodes (ACK calls them ``ecs``)."""

REFUSED_RESOURCES = ("eci", "elastic", "acs")
"""ACK's virtual capacity (ECI, elastic node pools, ACS): no GPU share can be booked there."""

MAX_UNITS = 100
"""The most units one policy may list (the CRD's ``spec.units`` ``maxItems``, checked on read).

A node pool per unit: ACK's own examples use two or three; a hundred leaves room for a pool per
zone and GPU model while keeping a filter's reply (reasons name units) and a bind's check small.
"""

SHOWN_VALUE_CHARS = 200
"""How much of a refused value a message quotes (a units list may be the whole object)."""

DEFAULT_TIMEOUT_S = 15 * 60
"""``whenTryNextUnits.timeout`` when left out (ACK's default)."""

LABEL_WAIT_FOR_SCALING = "k8s.aliyun.com/resource-policy-wait-for-ecs-scaling"
"""In a unit's ``podLabels`` with value ``"true"``: a unit without ``max`` is waited for (its
node pool may be scaling out) as a unit with room is. ACK does not put it on the pods, nor does
gpushare."""


class NextPolicy(Enum):
    """When a pod may go on past a unit (``whenTryNextUnits.policy``), as ACK documents them.

    A unit holding its ``max`` is always passed (save under ``LackResourceAndNoTerminating``
    while its pods are terminating); the policies differ on a unit with room whose nodes cannot
    take the pod now.
    """

    EXCEED_MAX = "ExceedMax"
    """Wait for a unit with ``max`` until it is full; pass a unit without ``max`` (unless its
    ``podLabels`` ask to wait for scaling, then wait for it)."""
    LACK_RESOURCE_OR_EXCEED_MAX = "LackResourceOrExceedMax"
    """Pass the unit (ACK's default)."""
    TIMEOUT_OR_EXCEED_MAX = "TimeoutOrExceedMax"
    """As ``ExceedMax``, but only until the pod is ``timeout`` old; then pass the unit."""
    LACK_RESOURCE_AND_NO_TERMINATING = "LackResourceAndNoTerminating"
    """Pass the unit (full or not) only when none of the policy's pods in it is terminating:
    during a rolling update the new pods wait for the room the old ones are giving back."""


NEXT_POLICY_ALIASES = {"LackResourceAndNoterminating": NextPolicy.LACK_RESOURCE_AND_NO_TERMINATING}
"""Spellings ACK's API type accepts besides the documented ones."""


class PreemptPolicy(Enum):
    """ACK's ``preemptPolicy``: when preemption is tried for a pod a policy orders.

    gpushare answers kube-scheduler's filter and bind, not its preemption (the extender
    declares no preempt verb), so preemption is kube-scheduler's DefaultPreemption, which runs
    only when no node passed the filter: for a pod a policy orders, only once no unit is open
    to it. That is ``AfterAllUnits``; ``BeforeNextUnit`` (preempt in a unit before going on to
    the next) is not done, and a policy asking for it is told so (``ResourcePolicy.notices``).
    """

    AFTER_ALL_UNITS = "AfterAllUnits"
    BEFORE_NEXT_UNIT = "BeforeNextUnit"


@dataclass(frozen=True)
class Unit:
    """One pool of nodes in a policy's order; ``number`` counts from 1 as people do."""

    number: int
    node_selector: Mapping[str, str]
    max_pods: int | None = None
    """At most this many of the policy's pods (of one ``matchLabelKeys`` group) here."""
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels bind adds to the pod (``LABEL_WAIT_FOR_SCALING`` left out)."""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    waits_for_scaling: bool = False
    """``podLabels`` carried ``LABEL_WAIT_FOR_SCALING: "true"``."""

    def holds(self, node_labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels belongs to the unit."""
        return all(node_labels.get(k) == v for k, v in self.node_selector.items())

    def describe(self) -> str:
        """``unit 1 (nodeSelector pool=a)``, as reasons name it."""
        sel = ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items())) or "any node"
        return f"unit {self.number} (nodeSelector {sel})"


class UnitIndex:
    """The units that hold a node, found without testing every unit against it.

    Each unit is filed under one pair of its ``nodeSelector``, the pair fewest units share; a
    node can only be in the units filed under one of its own labels, and only those are tested.
    Built once per policy read, so a filter costs one look per node label and per candidate,
    not one test per unit and node (``core.resourcepolicies.gating`` counts fitting nodes per unit
    this way).
    """

    def __init__(self, units: Iterable[Unit]) -> None:
        units = tuple(units)
        shared = Counter(pair for u in units for pair in u.node_selector.items())
        self._filed: dict[tuple[str, str], list[Unit]] = {}
        for unit in units:
            if not unit.node_selector:  # only a hand-made Unit; reading requires a selector
                self._filed.setdefault(("", ""), []).append(unit)
                continue
            pair = min(sorted(unit.node_selector.items()), key=lambda p: shared[p])
            self._filed.setdefault(pair, []).append(unit)
        self._keys = sorted({k for k, _ in self._filed if k})

    def holding(self, node_labels: Mapping[str, str]) -> list[Unit]:
        """The units a node with these labels belongs to, in the policy's order."""
        found = [u for u in self._filed.get(("", ""), ())]
        keys: Iterable[str] = self._keys if len(self._keys) < len(node_labels) else node_labels
        for key in keys:
            value = node_labels.get(key)
            if value is not None:
                found.extend(u for u in self._filed.get((key, value), ()) if u.holds(node_labels))
        return sorted(found, key=lambda u: u.number)

    def first_holding(self, node_labels: Mapping[str, str]) -> Unit | None:
        """The first unit a node with these labels belongs to, if any."""
        return next(iter(self.holding(node_labels)), None)


@dataclass(frozen=True)
class ResourcePolicy:
    """A checked policy."""

    namespace: str
    name: str
    selector: Mapping[str, str]
    units: tuple[Unit, ...]
    next_policy: NextPolicy = NextPolicy.LACK_RESOURCE_OR_EXCEED_MAX
    timeout_s: float = DEFAULT_TIMEOUT_S
    preempt: PreemptPolicy = PreemptPolicy.AFTER_ALL_UNITS
    ignore_previous_pods: bool = False
    ignore_terminating_pods: bool = True
    match_label_keys: tuple[str, ...] = ()
    created: str = ""
    """metadata.creationTimestamp (RFC 3339), for ``ignorePreviousPod``."""
    uid: str = ""
    generation: int = 0
    """metadata.generation read: shows whether the extender has taken in a change."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @cached_property
    def index(self) -> UnitIndex:
        """The units filed by their nodeSelector (built on first use, once per policy read)."""
        return UnitIndex(self.units)

    @property
    def notices(self) -> tuple[str, ...]:
        """What in the policy gpushare accepts but does not do, each naming the field."""
        if self.preempt is not PreemptPolicy.BEFORE_NEXT_UNIT:
            return ()
        return (
            f"ResourcePolicy {self.key}: spec.preemptPolicy BeforeNextUnit has no effect in "
            f"gpushare: a pod goes on to the next unit without preemption being tried in the "
            f"one before. Preemption (kube-scheduler's DefaultPreemption) is tried only when no "
            f"unit is open to the pod, as with AfterAllUnits; set AfterAllUnits or leave the "
            f"field out to say so",
        )

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod in ``namespace`` with these labels is ordered by this policy."""
        if namespace != self.namespace or not self.selector:
            return False
        return all(labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True)
class InvalidResourcePolicy:
    """A ResourcePolicy gpushare cannot apply, and why: a value the book keeps (its pods are
    told at filter), not an exception; the cGPU policy's ``isolation.policy.PolicyError`` is one."""

    namespace: str
    name: str
    message: str
    selector: Mapping[str, str] = field(default_factory=dict)
    """The pods it was meant for (when its selector could be read): they are told why."""
    generation: int = 0
    uid: str = ""
    """metadata.uid, so that a Warning Event on the policy can say why too."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


class _Invalid(Exception):
    pass


def _where(policy: str, path: str, value: object, rule: str) -> _Invalid:
    shown = clip(repr(value), SHOWN_VALUE_CHARS)
    return _Invalid(f"ResourcePolicy {policy}: {path} is {shown}: {rule}")


def _string_map(value: object, path: str, policy: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _where(policy, path, value, "it must map label names to string values")
    return dict(value)


_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|m|s|ms))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration such as ``1m30s``, or None if it is not one."""
    if not _DURATION.match(text):
        return None
    return sum(float(n) * _SECONDS[u] for n, u in _PART.findall(text))


def _unit(raw: object, number: int, policy: str) -> Unit:
    path = f"spec.units[{number - 1}]"
    if not isinstance(raw, Mapping):
        raise _where(policy, path, raw, "each unit must be an object")
    resource = raw.get("resource") or "ecs"
    if resource in REFUSED_RESOURCES:
        raise _where(
            policy,
            f"{path}.resource",
            resource,
            "gpushare shares GPUs only on the cluster's own nodes (resource ecs); ECI, elastic "
            "and ACS capacity has no GPU gpushare can book. Remove this unit or set resource: "
            "ecs with a nodeSelector for a node pool",
        )
    if resource not in SERVED_RESOURCES:
        raise _where(policy, f"{path}.resource", resource, "the supported value is ecs")
    selector = _string_map(raw.get("nodeSelector"), f"{path}.nodeSelector", policy)
    if not selector:
        raise _where(
            policy,
            f"{path}.nodeSelector",
            raw.get("nodeSelector"),
            "a unit of resource ecs needs a nodeSelector naming its node pool's labels",
        )
    max_pods = raw.get("max")
    if max_pods is not None and (
        isinstance(max_pods, bool) or not isinstance(max_pods, int) or max_pods < 0
    ):
        raise _where(policy, f"{path}.max", max_pods, "it must be a whole number, 0 or more")
    pod_labels = _string_map(raw.get("podLabels"), f"{path}.podLabels", policy)
    waits = pod_labels.pop(LABEL_WAIT_FOR_SCALING, "") == "true"
    return Unit(
        number=number,
        node_selector=selector,
        max_pods=max_pods,
        pod_labels=pod_labels,
        pod_annotations=_string_map(raw.get("podAnnotations"), f"{path}.podAnnotations", policy),
        waits_for_scaling=waits,
    )


def _enum(
    kind: type[NextPolicy] | type[PreemptPolicy], value: object, path: str, policy: str
) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise _where(policy, path, value, f"the supported values are {allowed}") from None


def _flag(spec: Mapping[str, Any], name: str, default: bool, policy: str) -> bool:
    value = spec.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _where(policy, f"spec.{name}", value, "it must be true or false")
    return value


def _read(obj: KubeObject, policy: str) -> ResourcePolicy:
    spec = spec_of(obj)
    selector = _string_map(spec.get("selector"), "spec.selector", policy)
    if not selector:
        raise _where(
            policy, "spec.selector", spec.get("selector"), "it must name at least one pod label"
        )
    strategy = spec.get("strategy") or "prefer"
    if strategy != "prefer":
        raise _where(policy, "spec.strategy", strategy, "the supported value is prefer")
    raw_units = spec.get("units")
    if not isinstance(raw_units, list) or not raw_units:
        raise _where(policy, "spec.units", raw_units, "list at least one unit")
    if len(raw_units) > MAX_UNITS:
        raise _Invalid(
            f"ResourcePolicy {policy}: spec.units lists {len(raw_units)} units: at most "
            f"{MAX_UNITS} are allowed. Give the nodes of units that may share one place in the "
            f"order a common label and select them with one unit, or split the pods among "
            f"several policies"
        )
    units = tuple(_unit(u, i, policy) for i, u in enumerate(raw_units, start=1))
    when = spec.get("whenTryNextUnits") or {}
    if not isinstance(when, Mapping):
        raise _where(policy, "spec.whenTryNextUnits", when, "it must be an object")
    raw_next = when.get("policy") or NextPolicy.LACK_RESOURCE_OR_EXCEED_MAX.value
    next_policy = NEXT_POLICY_ALIASES.get(str(raw_next)) or _enum(
        NextPolicy, raw_next, "spec.whenTryNextUnits.policy", policy
    )
    timeout_s: float = DEFAULT_TIMEOUT_S
    if when.get("timeout"):
        parsed = parse_duration(str(when["timeout"]))
        if parsed is None:
            raise _where(
                policy,
                "spec.whenTryNextUnits.timeout",
                when["timeout"],
                "write a duration such as 30s, 5m or 1h",
            )
        timeout_s = parsed
    preempt = _enum(
        PreemptPolicy,
        spec.get("preemptPolicy") or PreemptPolicy.AFTER_ALL_UNITS.value,
        "spec.preemptPolicy",
        policy,
    )
    keys = spec.get("matchLabelKeys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise _where(policy, "spec.matchLabelKeys", keys, "list label names")
    return ResourcePolicy(
        namespace=namespace_of(obj),
        name=name_of(obj),
        selector=selector,
        units=units,
        next_policy=next_policy,
        timeout_s=timeout_s,
        preempt=preempt,
        ignore_previous_pods=_flag(spec, "ignorePreviousPod", False, policy),
        ignore_terminating_pods=_flag(spec, "ignoreTerminatingPod", True, policy),
        match_label_keys=tuple(keys),
        created=str(meta(obj).get("creationTimestamp") or ""),
        uid=str(meta(obj).get("uid") or ""),
        generation=_generation(obj),
    )


def _generation(obj: KubeObject) -> int:
    value = meta(obj).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def read_policy(obj: KubeObject) -> ResourcePolicy | InvalidResourcePolicy:
    """The policy in ``obj``, or why gpushare cannot apply it."""
    key = f"{namespace_of(obj)}/{name_of(obj)}"
    try:
        return _read(obj, key)
    except _Invalid as err:
        try:
            selector = _string_map(spec_of(obj).get("selector"), "spec.selector", key)
        except _Invalid:
            selector = {}
        return InvalidResourcePolicy(
            namespace_of(obj),
            name_of(obj),
            str(err),
            selector,
            _generation(obj),
            uid=str(meta(obj).get("uid") or ""),
        )
