"""The extender wire format (k8s.io/kube-scheduler/extender/v1), spelled exactly.

The Go types carry no json tags, so every key is the Go field name in PascalCase. Nodes, when
sent (caches off), are a ``v1.NodeList`` in ordinary Kubernetes JSON.

The pydantic models describe the format (and the OpenAPI page); filter and prioritize bodies
carry thousands of names per call, so they are read with msgspec (typed decoding straight from
bytes, several times faster than parsing then validating) and their replies written with it.
Bind's small body is read the same way, so every verb refuses a bad body alike.

A body that is not the wire format is a ``WireError`` and an HTTP 400 whose message names the
field and the rule (``Pod.spec.containers: expected a list, got null``): JSON that is malformed,
not UTF-8 or nested deeper than the decoder goes, a field of the wrong type, and a pod or node
that ``core.shape`` finds unreadable. kube-scheduler shows the message in the pod's events.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from gpushare.core.shape import Path, ShapeProblem, node_shape, pod_shape, render_path

T = TypeVar("T")


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NodeList(_Wire):
    """A ``v1.NodeList``; only its items are used."""

    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of filter and prioritize."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Wire):
    """Reply of filter; a non-empty Error fails the whole scheduling attempt."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    """One entry of prioritize's reply; Score is 0..10."""

    Host: str
    Score: int


class WireError(ValueError):
    """A body that is not the wire format; ``loc`` names the field, as FastAPI's errors do.

    ``msg`` starts with the field's path, so it reads alone: ``NodeNames[1]: expected a string,
    got a number``.
    """

    def __init__(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error") -> None:
        field = render_path("", loc[1:]) if len(loc) > 1 else "body"
        self.loc = loc
        self.msg = f"{field}: {msg}"
        self.kind = kind
        super().__init__(self.msg)

    @classmethod
    def of_shape(cls, problem: ShapeProblem, prefix: Path) -> WireError:
        """A pod or node field of the wrong type, under ``prefix`` in the body."""
        return cls(
            ("body", *prefix, *problem.path), f"expected {problem.expected}, got {problem.got}"
        )

    def detail(self) -> list[dict[str, Any]]:
        """The error as a 400 reply's ``detail``."""
        return [{"loc": list(self.loc), "msg": self.msg, "type": self.kind}]


class _NodeList(msgspec.Struct):
    items: list[dict[str, Any]] = msgspec.field(default_factory=list)


class _Args(msgspec.Struct):
    Pod: dict[str, Any]
    Nodes: _NodeList | None = None
    NodeNames: list[str] | None = None


class _Priority(msgspec.Struct):
    Host: str
    Score: int


_read_args = msgspec.json.Decoder(_Args).decode
_write = msgspec.json.encode
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
_TYPES = {
    "object": "an object",
    "array": "a list",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
}
_EXPECTED = re.compile(r"^Expected `(\w+)`(?: \| `null`)?, got `(\w+)`$")


def _json_type(name: str) -> str:
    # msgspec names a decoded JSON number by the Python type it fits (int or float)
    return "a number" if name in ("int", "float") else _TYPES.get(name, f"`{name}`")


def _decode(decode: Callable[[bytes], T], body: bytes) -> T:
    """Decode a typed body; every way it can fail becomes a ``WireError``."""
    try:
        return decode(body)
    except msgspec.ValidationError as err:
        # msgspec says "Expected `array`, got `str` - at `$.NodeNames`"
        msg, _, path = str(err).partition(" - at `$")
        loc = tuple(key or int(index) for key, index in _STEP.findall(path.rstrip("`")))
        match = _EXPECTED.match(msg)
        if match:
            expected = _TYPES.get(match[1], f"`{match[1]}`")
            msg = f"expected {expected}, got {_json_type(match[2])}"
        elif msg.startswith("Object missing"):
            msg = msg.replace("Object missing", "missing", 1)
        raise WireError(("body", *loc), msg) from None
    except msgspec.DecodeError as err:
        raise WireError(("body",), f"not JSON: {err}", "json_invalid") from None
    except UnicodeDecodeError:
        try:
            body.decode("utf-8")  # where in the body, not in the string msgspec was reading
        except UnicodeDecodeError as where:
            bad = body[where.start : where.start + 1].hex()
            raise WireError(
                ("body",),
                f"not UTF-8: byte 0x{bad} at offset {where.start} ({where.reason}); "
                f"JSON must be sent as UTF-8",
                "json_invalid",
            ) from None
        raise  # pragma: no cover - the body is UTF-8 after all: not ours to explain
    except RecursionError:
        raise WireError(
            ("body",),
            "JSON nested too deeply to read; a Kubernetes object is a few dozen levels deep at "
            "most: send the object as the API server returned it",
            "json_invalid",
        ) from None


def read_args(body: bytes) -> ExtenderArgs:
    """Filter's and prioritize's body; ``WireError`` names the field and the rule it broke."""
    args = _decode(_read_args, body)
    problem = pod_shape(args.Pod)
    if problem:
        raise WireError.of_shape(problem, ("Pod",))
    nodes = None
    if args.Nodes is not None:
        for position, item in enumerate(args.Nodes.items):
            problem = node_shape(item)
            if problem:
                raise WireError.of_shape(problem, ("Nodes", "items", position))
        nodes = NodeList.model_construct(items=args.Nodes.items)
    # built without validation: msgspec and core.shape have checked every type read later
    return ExtenderArgs.model_construct(Pod=args.Pod, Nodes=nodes, NodeNames=args.NodeNames)


def filter_json(result: ExtenderFilterResult) -> bytes:
    """Filter's reply as bytes (msgspec writes it about three times faster than the model)."""
    nodes = None if result.Nodes is None else {"items": result.Nodes.items}
    return _write(
        {
            "Nodes": nodes,
            "NodeNames": result.NodeNames,
            "FailedNodes": result.FailedNodes,
            "FailedAndUnresolvableNodes": result.FailedAndUnresolvableNodes,
            "Error": result.Error,
        }
    )


def priorities_json(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """Prioritize's reply written straight from names and scores.

    Thousands of entries per call: a model per entry would cost more than the decision.
    """
    if len(hosts) != len(scores):
        raise ValueError(f"hosts={len(hosts)} and scores={len(scores)}: must be as many")
    return _write(list(map(_Priority, hosts, scores)))


class ExtenderBindingArgs(_Wire):
    """Body of bind."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class _Binding(msgspec.Struct):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


_read_binding = msgspec.json.Decoder(_Binding).decode


def read_binding_args(body: bytes) -> ExtenderBindingArgs:
    """Bind's body; ``WireError`` names the field and the rule it broke."""
    args = _decode(_read_binding, body)
    return ExtenderBindingArgs.model_construct(
        PodName=args.PodName, PodNamespace=args.PodNamespace, PodUID=args.PodUID, Node=args.Node
    )


class ExtenderBindingResult(_Wire):
    """Reply of bind; empty Error means bound."""

    Error: str = ""
