"""Read-only accessors for raw Kubernetes JSON (nodes and pods as plain dicts).

The core takes objects exactly as the API server, a test or a YAML file gives them, so it can
run in the extender, the demo and the simulator alike. These helpers tolerate missing fields.

The pod and node fields the core reads are spelled once, as TypedDicts (``PodSpec``,
``Container``, ``PodStatus``, ``NodeStatus``): ``pod_spec_of`` and the other typed accessors
hand them out, so mypy knows the type of each field the core reads (``spec.containers`` is a
list of ``Container``, a container's ``resources.limits`` a ResourceList) and checks the code
that uses it; a misspelt key in ``.get`` reads as ``object``, which most uses then refuse. They
describe, they do not validate: the objects come from the API server, and where a body comes
from anyone else (the extender's wire, the webhook) ``core.model.shape`` checks these fields' types
first; readers still tolerate what is missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypedDict, cast

KubeObject = Mapping[str, Any]
Quantities = Mapping[str, Any]
"""A ResourceList: resource name to quantity (a string, or a number in hand-written YAML)."""


class ResourceRequirements(TypedDict, total=False):
    limits: Quantities
    requests: Quantities


class Container(TypedDict, total=False):
    """The container fields the core reads (core/v1 Container)."""

    name: str
    restartPolicy: str
    """``Always`` on an init container makes it a sidecar."""
    resources: ResourceRequirements
    env: list[Mapping[str, Any]]


class PodSpec(TypedDict, total=False):
    """The pod spec fields the core reads (core/v1 PodSpec)."""

    nodeName: str
    schedulerName: str
    nodeSelector: Mapping[str, str]
    affinity: Mapping[str, Any]
    initContainers: list[Container]
    containers: list[Container]
    resources: ResourceRequirements
    """Pod-level resources, which win over the containers' sum when set."""
    overhead: Quantities
    topologySpreadConstraints: list[Mapping[str, Any]]
    resourceClaims: list[Mapping[str, Any]]
    volumes: list[Mapping[str, Any]]
    priority: int
    """Set by the API server from priorityClassName: which pod an intent gives way to
    (``core.decision.yielding``)."""


class PodStatus(TypedDict, total=False):
    phase: str


class NodeAddress(TypedDict, total=False):
    type: str
    address: str


class NodeStatus(TypedDict, total=False):
    """The node status fields the core reads (core/v1 NodeStatus)."""

    capacity: Quantities
    allocatable: Quantities
    addresses: list[NodeAddress]


def meta(obj: KubeObject) -> Mapping[str, Any]:
    """The object's metadata, or an empty mapping."""
    value = obj.get("metadata") or {}
    return value if isinstance(value, Mapping) else {}


def name_of(obj: KubeObject) -> str:
    """metadata.name, or an empty string."""
    return str(meta(obj).get("name") or "")


def namespace_of(obj: KubeObject) -> str:
    """metadata.namespace, defaulting to ``default`` as kubectl does."""
    return str(meta(obj).get("namespace") or "default")


def uid_of(obj: KubeObject) -> str:
    """metadata.uid, falling back to namespace/name for objects not yet stored."""
    uid = meta(obj).get("uid")
    return str(uid) if uid else key_of(obj)


def stored_uid_of(obj: KubeObject) -> str:
    """metadata.uid as the API server assigned it; empty for an object not yet stored (an
    event's involvedObject and a bind's UID check need the real one, never a stand-in)."""
    return str(meta(obj).get("uid") or "")


def key_of(obj: KubeObject) -> str:
    """``namespace/name``, the way logs and messages name a pod."""
    return f"{namespace_of(obj)}/{name_of(obj)}"


def labels_of(obj: KubeObject) -> Mapping[str, str]:
    """metadata.labels, or an empty mapping."""
    value = meta(obj).get("labels") or {}
    return value if isinstance(value, Mapping) else {}


def annotations_of(obj: KubeObject) -> Mapping[str, str]:
    """metadata.annotations, or an empty mapping."""
    value = meta(obj).get("annotations") or {}
    return value if isinstance(value, Mapping) else {}


def spec_of(obj: KubeObject) -> Mapping[str, Any]:
    """The object's spec, or an empty mapping."""
    value = obj.get("spec") or {}
    return value if isinstance(value, Mapping) else {}


def pod_spec_of(pod: KubeObject) -> PodSpec:
    """The pod's spec, typed as the fields the core reads; empty if absent."""
    return cast(PodSpec, spec_of(pod))


def pod_status_of(pod: KubeObject) -> PodStatus:
    """The pod's status, typed; empty if absent."""
    return cast(PodStatus, status_of(pod))


def node_status_of(node: KubeObject) -> NodeStatus:
    """The node's status, typed; empty if absent."""
    return cast(NodeStatus, status_of(node))


def node_name_of(pod: KubeObject) -> str:
    """spec.nodeName (the node the pod is bound to), or an empty string while unbound."""
    return str(pod_spec_of(pod).get("nodeName") or "")


CLAIM_VOLUMES = frozenset({"persistentVolumeClaim", "ephemeral"})
"""Volume kinds that bind a pod to storage: kube-scheduler weighs where those can go."""

_SPEC_READ = frozenset(PodSpec.__annotations__)
_CONTAINER_READ = frozenset(Container.__annotations__) - {"env"}
"""A container's ``env`` is read of an admission request's template (``core.admitting``),
never of a pod already stored."""
_STATUS_READ = frozenset(PodStatus.__annotations__)


def read_fields(pod: KubeObject) -> dict[str, Any]:
    """The pod with only what the core reads of a stored pod: its whole metadata, the spec,
    container and status fields the TypedDicts above name, and of its volumes their names and
    kinds (what a kind holds only for claims).

    The extender keeps every pod kube-scheduler has not placed yet, and bind decides from that
    copy (``kube.pendingpods``). As the API server gives it, such a pod is about 9 KiB in
    memory, most of it what only kubelet reads (the service-account volume and its mounts,
    image, probes, defaults); a burst of tens of thousands of pending pods set the extender's
    peak. Whatever the core reads of this copy reads as of the whole pod
    (``tests/unit/kube/test_slim_objects.py`` records what a decision reads and checks it).
    Sub-objects are shared with ``pod``, not copied.
    """
    spec = spec_of(pod)
    kept: dict[str, Any] = {k: v for k, v in spec.items() if k in _SPEC_READ}
    for kind in ("initContainers", "containers"):
        if isinstance(kept.get(kind), list):
            kept[kind] = [_container_read(c) for c in kept[kind]]
    if isinstance(kept.get("volumes"), list):
        kept["volumes"] = [_volume_read(v) for v in kept["volumes"]]
    out: dict[str, Any] = {k: v for k, v in pod.items() if k not in ("spec", "status")}
    if "spec" in pod:
        out["spec"] = kept if isinstance(pod["spec"], Mapping) else pod["spec"]
    if "status" in pod:
        status = pod["status"]
        out["status"] = (
            {k: v for k, v in status.items() if k in _STATUS_READ}
            if isinstance(status, Mapping)
            else status
        )
    return out


def _volume_read(volume: Any) -> Any:
    """A volume's name and kind; what the kind holds only for a claim (``CLAIM_VOLUMES``)."""
    if not isinstance(volume, Mapping) or CLAIM_VOLUMES & set(volume):
        return volume
    return {k: {} if isinstance(v, Mapping) else v for k, v in volume.items()}


def _container_read(container: Any) -> Any:
    if not isinstance(container, Mapping):
        return container
    return {k: v for k, v in container.items() if k in _CONTAINER_READ}


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which its containers never run again: what it held is free."""


def status_of(obj: KubeObject) -> Mapping[str, Any]:
    """The object's status, or an empty mapping."""
    value = obj.get("status") or {}
    return value if isinstance(value, Mapping) else {}


def internal_ip(node: KubeObject) -> str:
    """The node's first InternalIP address, or an empty string."""
    for address in node_status_of(node).get("addresses") or []:
        if isinstance(address, Mapping) and address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""


MAX_COUNT_DIGITS = 19
"""Digits of the longest whole number read from text (an int64 has 19). Longer text is not a
count anyone meant, and Python refuses to convert more than 4,300 digits at all."""
MAX_EMBEDDED_JSON = 1 << 20
"""Characters of JSON kept in one annotation (kube-apiserver allows 256 KiB of annotations
per object; more is not what a gpushare component wrote)."""


def whole_number(text: object) -> int | None:
    """The value of plain ASCII decimal text (``"12"``, `` 12 ``), or None.

    ``str.isdigit`` also accepts ``"²"`` and ``"٣"``, which ``int`` then refuses or reads as
    another number, and text past a few thousand digits makes ``int`` raise: every count that
    gpushare reads from an annotation, a label or a flag goes through here instead.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_COUNT_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def embedded_json(text: str) -> tuple[Any, str]:
    """The JSON value held in an annotation's text, or (None, why it cannot be read).

    ``json.loads`` raises ``ValueError`` beyond ``JSONDecodeError`` (a number past Python's
    4,300-digit limit) and ``RecursionError`` on deep nesting; both mean the same as malformed
    JSON here, so each comes back as a reason, never as an exception.
    """
    if len(text) > MAX_EMBEDDED_JSON:
        return None, f"is longer than {MAX_EMBEDDED_JSON} characters"
    try:
        return json.loads(text), ""
    except json.JSONDecodeError as err:
        return None, f"is not JSON ({err.msg})"
    except (ValueError, RecursionError) as err:
        return None, f"is not JSON gpushare can read ({str(err)[:80] or type(err).__name__})"


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def name_problem(value: object, *, namespace: bool = False) -> str | None:
    """Why ``value`` cannot be an object's name (or, with ``namespace``, a namespace); None
    when it can be.

    Pods, nodes, Secrets and Events are named by DNS-1123 subdomains (at most 253 characters of
    ``a-z``, ``0-9``, ``-`` and ``.``), namespaces by DNS-1123 labels (63, no ``.``): the rules
    kube-apiserver holds every name to. A name that breaks them names no object, and, put into a
    request path, ``../nodes/x`` or ``x?dryRun=All`` would reach another one.
    """
    rule = (
        "a DNS-1123 label (at most 63 characters: a-z, 0-9 and '-', starting and ending with a "
        "letter or digit)"
        if namespace
        else "a DNS-1123 subdomain (at most 253 characters: a-z, 0-9, '-' and '.', starting and "
        "ending with a letter or digit)"
    )
    pattern, most = (_LABEL, 63) if namespace else (_SUBDOMAIN, 253)
    if not isinstance(value, str) or len(value) > most or not pattern.fullmatch(value):
        return f"{str(value)[:80]!r} is not {rule}"
    return None
