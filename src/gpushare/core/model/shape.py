"""Whether a pod or node has the JSON shape gpushare reads, checked before anything reads it.

The readers of the core (``read_pod``, ``read_node``, the ledger, ``core.placement.preferences``,
``core.model.hostresources``, ``core.model.gpumodel``, ``core.admitting.tampering``) expect objects
shaped as
Kubernetes writes them. A body made by hand or by a broken client can hold ``null`` or a string
where Kubernetes puts a list, and a reader would then fail with an exception deep inside a
decision. So every edge checks the shape first, here, with one description: the extender's wire
answers 400 with one sentence that names the field (``Pod.spec.containers: expected a list, got
null``), the webhook refuses the object with it, and the cache skips (and counts) a watched
object that has a problem instead of letting it end the watch.

The description is the ``_Pod`` and ``_Node`` structs below: every field any reader of the core
looks at, typed as core/v1 types it, and nothing else (unknown fields pass untouched). A field
may be absent wherever Kubernetes omits it, but ``null`` is refused where a list or an object
belongs: Kubernetes never writes it there (an empty list or map is omitted). The one ``null``
Kubernetes does write, an unset ``creationTimestamp`` in an object not yet stored (what admission
sees), is accepted. Quantities may be strings or numbers (hand-written YAML); their values are
left to the readers, whose rules say more than a type can. A test
(tests/unit/core/model/test_shape.py) runs every reader over objects that pass, so a reader
that looks at a field not described here shows up as an exception there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

Path = tuple[str | int, ...]
Quantity = str | int | float
Strings = dict[str, str]


class _Requirement(msgspec.Struct):
    key: str = ""
    operator: str = ""
    values: list[str] = []


class _LabelSelector(msgspec.Struct):
    matchLabels: Strings = {}
    matchExpressions: list[_Requirement] = []


class _NodeSelectorTerm(msgspec.Struct):
    matchExpressions: list[_Requirement] = []
    matchFields: list[_Requirement] = []


class _NodeSelector(msgspec.Struct):
    nodeSelectorTerms: list[_NodeSelectorTerm] = []


class _PreferredTerm(msgspec.Struct):
    weight: int = 0
    preference: _NodeSelectorTerm = msgspec.field(default_factory=_NodeSelectorTerm)


class _NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: _NodeSelector = msgspec.field(
        default_factory=_NodeSelector
    )
    preferredDuringSchedulingIgnoredDuringExecution: list[_PreferredTerm] = []


class _PodAffinityTerm(msgspec.Struct):
    labelSelector: _LabelSelector = msgspec.field(default_factory=_LabelSelector)
    namespaceSelector: _LabelSelector = msgspec.field(default_factory=_LabelSelector)
    namespaces: list[str] = []
    topologyKey: str = ""
    matchLabelKeys: list[str] = []
    mismatchLabelKeys: list[str] = []


class _WeightedPodAffinityTerm(msgspec.Struct):
    weight: int = 0
    podAffinityTerm: _PodAffinityTerm = msgspec.field(default_factory=_PodAffinityTerm)


class _PodAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: list[_PodAffinityTerm] = []
    preferredDuringSchedulingIgnoredDuringExecution: list[_WeightedPodAffinityTerm] = []


class _Affinity(msgspec.Struct):
    nodeAffinity: _NodeAffinity = msgspec.field(default_factory=_NodeAffinity)
    podAffinity: _PodAffinity = msgspec.field(default_factory=_PodAffinity)
    podAntiAffinity: _PodAffinity = msgspec.field(default_factory=_PodAffinity)


class _Resources(msgspec.Struct):
    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}


class _EnvVar(msgspec.Struct):
    name: str = ""
    value: str = ""
    valueFrom: dict[str, Any] = {}


class _EnvFrom(msgspec.Struct):
    prefix: str = ""


class _VolumeMount(msgspec.Struct):
    name: str = ""
    mountPath: str = ""


class _Container(msgspec.Struct):
    name: str = ""
    restartPolicy: str = ""
    resources: _Resources = msgspec.field(default_factory=_Resources)
    env: list[_EnvVar] = []
    envFrom: list[_EnvFrom] = []
    volumeMounts: list[_VolumeMount] = []


class _SpreadConstraint(msgspec.Struct):
    whenUnsatisfiable: str = ""
    topologyKey: str = ""
    labelSelector: _LabelSelector = msgspec.field(default_factory=_LabelSelector)


class _PodSpec(msgspec.Struct):
    nodeName: str = ""
    schedulerName: str = ""
    containers: list[_Container] = []
    initContainers: list[_Container] = []
    ephemeralContainers: list[_Container] = []
    affinity: _Affinity = msgspec.field(default_factory=_Affinity)
    nodeSelector: Strings = {}
    overhead: dict[str, Quantity] = {}
    resources: _Resources = msgspec.field(default_factory=_Resources)
    topologySpreadConstraints: list[_SpreadConstraint] = []
    volumes: list[dict[str, Any]] = []
    resourceClaims: list[dict[str, Any]] = []


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generateName: str = ""
    labels: Strings = {}
    annotations: Strings = {}
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None


class _PodStatus(msgspec.Struct):
    phase: str = ""
    containerStatuses: list[dict[str, Any]] = []
    initContainerStatuses: list[dict[str, Any]] = []


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _PodSpec = msgspec.field(default_factory=_PodSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _Taint(msgspec.Struct):
    key: str = ""
    value: str = ""
    effect: str = ""


class _NodeSpec(msgspec.Struct):
    taints: list[_Taint] = []
    unschedulable: bool = False


class _Address(msgspec.Struct):
    type: str = ""
    address: str = ""


class _NodeStatus(msgspec.Struct):
    capacity: dict[str, Quantity] = {}
    allocatable: dict[str, Quantity] = {}
    addresses: list[_Address] = []


class _Node(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _NodeSpec = msgspec.field(default_factory=_NodeSpec)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


@dataclass(frozen=True)
class ShapeProblem:
    """A field whose JSON type is not the one Kubernetes gives it."""

    path: Path
    """Keys and list positions from the checked object to the field."""
    expected: str
    got: str

    def rule(self) -> str:
        """``expected <type>, got <type>`` (or what else the decoder said, with no type)."""
        return f"expected {self.expected}, got {self.got}" if self.expected else self.got

    def message(self, root: str = "") -> str:
        """``<root>.<path>: expected <type>, got <type>``."""
        return f"{render_path(root, self.path)}: {self.rule()}"


def render_path(root: str, path: Path) -> str:
    """``Pod`` + ``("spec", "containers", 0)`` gives ``Pod.spec.containers[0]``."""
    out = root
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        else:
            out += f".{step}" if out else step
    return out or "the object"


def json_kind(value: Any) -> str:
    """A JSON value's type, as a message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_EXPECTED = re.compile(r"^Expected `([^`]+)`(?: \| `null`)?, got `(\w+)`")
_TYPES = {
    "object": "an object",
    "array": "a list",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "int | float | str": "a quantity (a string or a number)",
    "str | null": "a string",
}


_ANY_KEY = "[...]"
"""How msgspec names a map's value: the key is found again in the object (``_key_of``)."""


def problem_of(err: msgspec.ValidationError, obj: Any = None) -> ShapeProblem:
    """msgspec's ``Expected `array`, got `str` - at `$.spec.containers` `` as a problem.

    msgspec writes a map's value as ``[...]``; with ``obj`` given, the first key there whose
    value has the wrong type takes its place, so the message names the label or resource.
    """
    text, _, where = str(err).partition(" - at `$")
    where = where.removesuffix("`")
    match = _EXPECTED.match(text)
    got = expected = ""
    if match:
        got = "a number" if match[2] in ("int", "float") else _TYPES.get(match[2], match[2])
        expected = _TYPES.get(match[1], f"`{match[1]}`")
    path: Path = ()
    for part in where.split(_ANY_KEY) if where else ():
        path = (*path, *(k if k else int(i) for k, i in _STEP.findall(part)))
        if part is not where.split(_ANY_KEY)[-1]:
            path = (*path, _key_of(obj, path, got))
    if not match:
        return ShapeProblem(path, "", text.replace("Object missing", "missing", 1))
    return ShapeProblem(path, expected, got)


def _key_of(obj: Any, path: Path, got: str) -> str:
    """The first key of the map at ``path`` in ``obj`` whose value is of the kind ``got``."""
    here = obj
    for step in path:
        try:
            here = here[step]
        except (KeyError, IndexError, TypeError):
            return _ANY_KEY
    if isinstance(here, Mapping):
        for key, value in here.items():
            if json_kind(value) == got:
                return str(key)
    return _ANY_KEY


def _checked(obj: Any, kind: type[msgspec.Struct], path: Path) -> ShapeProblem | None:
    if not isinstance(obj, Mapping):
        return ShapeProblem(path, "an object", json_kind(obj))
    try:
        msgspec.convert(obj, kind)
    except msgspec.ValidationError as err:
        problem = problem_of(err, obj)
        return ShapeProblem((*path, *problem.path), problem.expected, problem.got)
    return None


def pod_shape(pod: Any, path: Path = ()) -> ShapeProblem | None:
    """The first field of a pod (or pod template) that gpushare cannot read, or None."""
    return _checked(pod, _Pod, path)


def node_shape(node: Any, path: Path = ()) -> ShapeProblem | None:
    """The first field of a node that gpushare cannot read, or None; a node needs its name."""
    problem = _checked(node, _Node, path)
    if problem:
        return problem
    meta = node.get("metadata", {})
    if not meta.get("name"):
        got = "an empty string" if "name" in meta else "nothing"
        return ShapeProblem((*path, "metadata", "name"), "a non-empty string", got)
    return None
