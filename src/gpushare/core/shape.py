"""Whether a pod or node has the JSON shape gpushare reads, checked before anything reads it.

The readers of the core (``read_pod``, ``read_node``) expect objects shaped as Kubernetes writes
them. A body made by hand or by a broken client can hold ``null`` or a string where Kubernetes
puts a list, and a reader would then fail with an exception deep inside a decision. The edges
(the extender's wire, the webhook) check the shape first and answer 400 with one sentence that
names the field and what it must be: ``Pod.spec.containers: expected a list, got null``.

Only the fields gpushare reads are checked. A field may be absent wherever Kubernetes omits it,
but ``null`` is refused where a list or an object belongs: Kubernetes never writes it there (an
empty list or map is omitted; ``containers``, the only list it always writes, is never empty).
Resource values are left to ``read_pod``, whose rules say more than a type can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]

_CONTAINER_LISTS = ("initContainers", "containers")
_RESOURCE_MAPS = ("limits", "requests")


@dataclass(frozen=True)
class ShapeProblem:
    """A field whose JSON type is not the one Kubernetes gives it."""

    path: Path
    """Keys and list positions from the checked object to the field."""
    expected: str
    got: str

    def message(self, root: str = "") -> str:
        """``<root>.<path>: expected <type>, got <type>``."""
        return f"{render_path(root, self.path)}: expected {self.expected}, got {self.got}"


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


def _object(value: Any, path: Path) -> ShapeProblem | None:
    if isinstance(value, Mapping):
        return None
    return ShapeProblem(path, "an object", json_kind(value))


_KINDS: dict[str, type] = {"an object": Mapping, "a list": list, "a string": str}


def _optional(
    parent: Mapping[str, Any], key: str, path: Path, expected: str
) -> ShapeProblem | None:
    """The field may be absent; present, it must be ``expected`` (never null)."""
    if key not in parent:
        return None
    value = parent[key]
    if isinstance(value, _KINDS[expected]):
        return None
    return ShapeProblem((*path, key), expected, json_kind(value))


def _strings(parent: Mapping[str, Any], key: str, path: Path) -> ShapeProblem | None:
    """An optional object whose values are all strings (labels, annotations)."""
    problem = _optional(parent, key, path, "an object")
    if problem or key not in parent:
        return problem
    for name, value in parent[key].items():
        if not isinstance(value, str):
            return ShapeProblem((*path, key, name), "a string", json_kind(value))
    return None


def _metadata(obj: Mapping[str, Any], path: Path) -> ShapeProblem | None:
    problem = _optional(obj, "metadata", path, "an object")
    if problem or "metadata" not in obj:
        return problem
    meta = obj["metadata"]
    here = (*path, "metadata")
    for key in ("name", "namespace", "uid"):
        problem = _optional(meta, key, here, "a string")
        if problem:
            return problem
    return _strings(meta, "labels", here) or _strings(meta, "annotations", here)


def _container(container: Any, path: Path) -> ShapeProblem | None:
    problem = _object(container, path)
    if problem:
        return problem
    for key in ("name", "restartPolicy"):
        problem = _optional(container, key, path, "a string")
        if problem:
            return problem
    problem = _optional(container, "resources", path, "an object")
    if problem or "resources" not in container:
        return problem
    resources = container["resources"]
    for key in _RESOURCE_MAPS:
        problem = _optional(resources, key, (*path, "resources"), "an object")
        if problem:
            return problem
    return None


def pod_shape(pod: Any, path: Path = ()) -> ShapeProblem | None:
    """The first field of a pod (or pod template) that gpushare cannot read, or None."""
    problem = _object(pod, path) or _metadata(pod, path)
    if problem:
        return problem
    problem = _optional(pod, "spec", path, "an object")
    if problem or "spec" not in pod:
        return problem
    spec = pod["spec"]
    here = (*path, "spec")
    for key in ("nodeName", "schedulerName"):
        problem = _optional(spec, key, here, "a string")
        if problem:
            return problem
    for key in _CONTAINER_LISTS:
        problem = _optional(spec, key, here, "a list")
        if problem:
            return problem
        for position, container in enumerate(spec.get(key, ())):
            problem = _container(container, (*here, key, position))
            if problem:
                return problem
    return None


def node_shape(node: Any, path: Path = ()) -> ShapeProblem | None:
    """The first field of a node that gpushare cannot read, or None; a node needs its name."""
    problem = _object(node, path) or _metadata(node, path)
    if problem:
        return problem
    meta = node.get("metadata", {})
    if not meta.get("name"):
        got = "an empty string" if "name" in meta else "nothing"
        return ShapeProblem((*path, "metadata", "name"), "a non-empty string", got)
    problem = _optional(node, "status", path, "an object")
    if problem or "status" not in node:
        return problem
    status = node["status"]
    here = (*path, "status")
    for key in ("capacity", "allocatable"):
        problem = _optional(status, key, here, "an object")
        if problem:
            return problem
    problem = _optional(status, "addresses", here, "a list")
    if problem:
        return problem
    for position, address in enumerate(status.get("addresses", ())):
        problem = _object(address, (*here, "addresses", position))
        if problem:
            return problem
    return None
