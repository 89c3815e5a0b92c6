"""Read-only accessors for raw Kubernetes JSON (nodes and pods as plain dicts).

The core takes objects exactly as the API server, a test or a YAML file gives them, so it can
run in the extender, the demo and the simulator alike. These helpers tolerate missing fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KubeObject = Mapping[str, Any]


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


def node_name_of(pod: KubeObject) -> str:
    """spec.nodeName (the node the pod is bound to), or an empty string while unbound."""
    return str(spec_of(pod).get("nodeName") or "")


def status_of(obj: KubeObject) -> Mapping[str, Any]:
    """The object's status, or an empty mapping."""
    value = obj.get("status") or {}
    return value if isinstance(value, Mapping) else {}


def internal_ip(node: KubeObject) -> str:
    """The node's first InternalIP address, or an empty string."""
    for address in status_of(node).get("addresses") or []:
        if isinstance(address, Mapping) and address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""
