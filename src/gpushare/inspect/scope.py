"""What ``kubectl inspect cgpu`` shows and what its user may see (pure).

Two things narrow the view. The user's choice, in kubectl's words: ``-n NAMESPACE`` (or the
kubeconfig context's namespace), ``-A`` for every namespace, ``-l SELECTOR`` for pods by label.
And the user's rights: a tenant whose Role lets it list the pods of its own namespace and
nothing else cannot list nodes nor the pods of other namespaces. Node totals are always counted
from every pod the user may read, so an administrator's ``-n team-a`` shows the nodes team-a's
pods are on, as full as they are; a tenant's view counts only its own pods, and says so.

A node the user may not read is described from its pods, which carry what gpushare wrote at
bind: the node's name (``spec.nodeName``), its address (``status.hostIP``), the GPUs the pod
holds, their size (``ALIYUN_COM_GPU_MEM_DEV``, one GPU's memory) and the unit. GPUs none of the
pods hold, the node's mode and other tenants' shares stay unknown, and the output says so.

Label selectors follow ``kubectl get -l``: requirements joined by commas, each ``key``,
``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)`` or ``key notin (a,b)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare.core.model.inventory import Gpu, Mode, NodeInventory, Placement
from gpushare.core.model.kubejson import annotations_of, labels_of, status_of, uid_of, whole_number
from gpushare.core.model.names import ANN_DEV
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import from_pod

_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQUAL = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector."""

    key: str
    operator: str
    """``in``, ``notin``, ``exists`` or ``!exists`` (``=`` is ``in`` one value)."""
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether labels meet it, as the API server's label selector decides."""
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class Selector:
    """A label selector as ``-l`` takes it; empty matches every pod."""

    text: str = ""
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every requirement holds."""
        return all(r.matches(labels) for r in self.requirements)


def _terms(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def parse_selector(text: str) -> Selector:
    """Read ``-l``'s text; ValueError names the term that is not a requirement."""
    if not text.strip():
        return Selector()
    requirements = []
    for term in _terms(text):
        if found := _SET.match(term):
            values = frozenset(v.strip() for v in found.group(3).split(",") if v.strip())
            requirements.append(Requirement(found.group(1), found.group(2), values))
        elif found := _EQUAL.match(term):
            key, op, value = found.group(1), found.group(2), found.group(3)
            operator = "notin" if op == "!=" else "in"
            requirements.append(Requirement(key, operator, frozenset({value})))
        elif found := _EXISTS.match(term):
            operator = "!exists" if found.group(1) else "exists"
            requirements.append(Requirement(found.group(2), operator))
        else:
            raise ValueError(
                f"{term.strip()!r} is not a label requirement: write key, !key, key=value, "
                "key!=value, 'key in (a,b)' or 'key notin (a,b)', joined by commas"
            )
    return Selector(text=text.strip(), requirements=tuple(requirements))


@dataclass(frozen=True)
class Scope:
    """Which pods the user asked to see."""

    namespace: str = ""
    """Only this namespace's pods; empty: every namespace."""
    selector: Selector = Selector()

    @property
    def narrowed(self) -> bool:
        """Whether some pods are left out by choice."""
        return bool(self.namespace or self.selector.requirements)

    def selects(self, pod: Mapping[str, object]) -> bool:
        """Whether the pod is in scope."""
        metadata = pod.get("metadata")
        namespace = metadata.get("namespace", "") if isinstance(metadata, Mapping) else ""
        if self.namespace and namespace != self.namespace:
            return False
        return self.selector.matches(labels_of(pod))


@dataclass(frozen=True)
class Sight:
    """What the user's rights let ``kubectl inspect cgpu`` read."""

    nodes: bool = True
    """Nodes could be listed; else they are described from the pods (``nodes_from_pods``)."""
    pods_namespace: str = ""
    """Empty: pods of every namespace could be listed; else only this namespace's."""
    slices: bool = True
    """DRA mode: gpushare's ResourceSlices could be listed; else each DRA node is what the
    claims hold (``inspect.dramode``). Set False only where claims showed DRA mode."""
    claims: bool = True
    """DRA mode: the ResourceClaims could be listed where the pods were; else DRA holdings are
    missing. Set False only where slices showed DRA mode."""

    @property
    def whole(self) -> bool:
        """Whether nothing was hidden from the user."""
        return self.nodes and not self.pods_namespace and self.slices and self.claims

    def hidden(self) -> tuple[str, ...]:
        """What could not be read, one phrase each (the JSON's ``scope.forbidden``)."""
        out = []
        if not self.nodes:
            out.append("nodes")
        if self.pods_namespace:
            out.append("pods outside namespace " + self.pods_namespace)
        if not self.slices:
            out.append("resourceslices")
        if not self.claims:
            out.append("resourceclaims")
        return tuple(out)


EVERY_POD = Scope()
"""No pod left out by choice (the seeds' view)."""

ALL_VISIBLE = Sight()
"""Nothing hidden by the reader's rights."""


def selected_uids(pods: Iterable[Mapping[str, object]], scope: Scope) -> frozenset[str] | None:
    """The UIDs of the pods in scope; None when the scope leaves none out."""
    if not scope.narrowed:
        return None
    return frozenset(uid_of(p) for p in pods if scope.selects(p))


def nodes_from_pods(pods: Iterable[Mapping[str, object]]) -> list[NodeInventory]:
    """What pods bound by gpushare tell of nodes their reader may not list.

    Per node: its name and address, and each GPU a pod holds there, sized by the pod's
    ``ALIYUN_COM_GPU_MEM_DEV`` in the unit of its record. The mode is unknown (``none``); the
    GPUs no pod of the reader holds are missing.
    """
    ips: dict[str, str] = {}
    units: dict[str, MemoryUnit] = {}
    gpus: dict[str, dict[int, int]] = {}
    for pod in pods:
        allocation = from_pod(pod)
        if allocation is None:
            continue
        node = allocation.node
        host_ip = status_of(pod).get("hostIP")
        if isinstance(host_ip, str) and host_ip:
            ips.setdefault(node, host_ip)
        units.setdefault(node, allocation.unit)
        size = whole_number(str(annotations_of(pod).get(ANN_DEV, ""))) or 0
        held = gpus.setdefault(node, {})
        for share in allocation.gpus:
            held[share.index] = max(held.get(share.index, 0), size, share.mem_units)
    return [
        NodeInventory(
            name=node,
            ip=ips.get(node, ""),
            mode=Mode.NONE,
            placement=Placement.from_label(None),
            unit=units[node],
            gpus=tuple(Gpu(index=i, mem_units=size) for i, size in sorted(held.items())),
            unit_declared=True,
        )
        for node, held in sorted(gpus.items())
    ]
