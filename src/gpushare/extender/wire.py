"""The extender wire format (k8s.io/kube-scheduler/extender/v1), spelled exactly.

The Go types carry no json tags, so every key is the Go field name in PascalCase. Nodes, when
sent (caches off), are a ``v1.NodeList`` in ordinary Kubernetes JSON.

The msgspec structs below are the one description of the format: they decode the bodies (typed
decoding straight from bytes: filter and prioritize carry thousands of names per call), encode
the replies, and give the OpenAPI page its schemas. Every verb refuses a bad body alike.

A body that is not the wire format is a ``WireError`` and an HTTP 400 whose message names the
field and the rule (``Pod.spec.containers: expected a list, got null``): JSON that is malformed,
not UTF-8 or nested deeper than the decoder goes, a field of the wrong type, and a pod or node
that ``core.model.shape`` finds unreadable. kube-scheduler shows the message in the pod's events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from gpushare.core.model.kubejson import name_problem
from gpushare.core.model.shape import (
    Path,
    ShapeProblem,
    node_shape,
    pod_shape,
    problem_of,
    render_path,
)

T = TypeVar("T")


class NodeList(msgspec.Struct):
    """A ``v1.NodeList``; only its items are used."""

    items: list[dict[str, Any]] = msgspec.field(default_factory=list)


class ExtenderArgs(msgspec.Struct):
    """Body of filter and prioritize."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct):
    """Reply of filter; a non-empty Error fails the whole scheduling attempt."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = msgspec.field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = msgspec.field(default_factory=dict)
    Error: str = ""


class HostPriority(msgspec.Struct):
    """One entry of prioritize's reply; Score is 0..10."""

    Host: str
    Score: int


class ExtenderBindingArgs(msgspec.Struct):
    """Body of bind."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(msgspec.Struct):
    """Reply of bind; empty Error means bound."""

    Error: str = ""


REQUESTS: dict[str, type[msgspec.Struct]] = {
    "filter": ExtenderArgs,
    "prioritize": ExtenderArgs,
    "bind": ExtenderBindingArgs,
}
REPLIES: dict[str, Any] = {
    "filter": ExtenderFilterResult,
    "prioritize": list[HostPriority],
    "bind": ExtenderBindingResult,
}
"""Each verb's body and reply, for the OpenAPI page (``openapi``)."""


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
        return cls(("body", *prefix, *problem.path), problem.rule())

    def detail(self) -> list[dict[str, Any]]:
        """The error as a 400 reply's ``detail``."""
        return [{"loc": list(self.loc), "msg": self.msg, "type": self.kind}]


_read_args = msgspec.json.Decoder(ExtenderArgs).decode
_read_binding = msgspec.json.Decoder(ExtenderBindingArgs).decode
_write = msgspec.json.encode


def _decode(decode: Callable[[bytes], T], body: bytes) -> T:
    """Decode a typed body; every way it can fail becomes a ``WireError``."""
    try:
        return decode(body)
    except msgspec.ValidationError as err:
        problem = problem_of(err)
        raise WireError(("body", *problem.path), problem.rule()) from None
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
    if args.Nodes is not None:
        for position, item in enumerate(args.Nodes.items):
            problem = node_shape(item)
            if problem:
                raise WireError.of_shape(problem, ("Nodes", "items", position))
    return args


def filter_json(result: ExtenderFilterResult) -> bytes:
    """Filter's reply as bytes."""
    return _write(result)


def priorities_json(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """Prioritize's reply written straight from names and scores, nodes that score 0 left out.

    kube-scheduler adds an extender's score only to the nodes the reply names
    (``prioritizeNodes`` in pkg/scheduler/schedule_one.go), so a node left out counts 0, as
    it would listed with 0. The one difference is the tie-break: a listed node draws a random
    number for ties on the total, an unlisted one keeps 0, so among nodes with equal totals the
    listed ones come first; that matters only where another score overturns the extender's
    top node, and then only between nodes the extender gave nothing. Most nodes of a large
    cluster score 0 (empty GPUs, with the best fit at 10), so the reply, which kube-scheduler
    decodes on every pod, shrinks from every node to the few that rank.
    """
    if len(hosts) != len(scores):
        raise ValueError(f"hosts={len(hosts)} and scores={len(scores)}: must be as many")
    return _write([HostPriority(h, s) for h, s in zip(hosts, scores, strict=True) if s])


def read_binding_args(body: bytes) -> ExtenderBindingArgs:
    """Bind's body; ``WireError`` names the field and the rule it broke.

    The names go into API paths (``/api/v1/namespaces/NS/pods/NAME/binding``), so each must be
    a name kube-apiserver would accept, or the call could reach another path.
    """
    args = _decode(_read_binding, body)
    for field, value, namespace in (
        ("PodNamespace", args.PodNamespace, True),
        ("PodName", args.PodName, False),
        ("Node", args.Node, False),
    ):
        problem = name_problem(value, namespace=namespace)
        if problem is not None:
            raise WireError(("body", field), f"{problem}; send the pod's and node's own names")
    return args


def binding_json(result: ExtenderBindingResult) -> bytes:
    """Bind's reply as bytes."""
    return _write(result)


def openapi_components() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each verb's body and reply schema, and the components they refer to, from the structs
    above: the one description of the wire format."""
    entries = [
        *(("request", verb, kind) for verb, kind in REQUESTS.items()),
        *(("reply", verb, kind) for verb, kind in REPLIES.items()),
    ]
    schemas, components = msgspec.json.schema_components(
        [kind for *_, kind in entries], ref_template="#/components/schemas/{name}"
    )
    by_verb: dict[str, dict[str, Any]] = {}
    for (side, verb, _), schema in zip(entries, schemas, strict=True):
        by_verb.setdefault(verb, {})[side] = schema
    return by_verb, components
