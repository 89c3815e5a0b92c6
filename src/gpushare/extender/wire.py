"""The extender wire format (k8s.io/kube-scheduler/extender/v1), spelled exactly.

The Go types carry no json tags, so every key is the Go field name in PascalCase. Nodes, when
sent (caches off), are a ``v1.NodeList`` in ordinary Kubernetes JSON.

The pydantic models describe the format (and the OpenAPI page); filter and prioritize bodies
carry thousands of names per call, so they are read with msgspec (typed decoding straight from
bytes, several times faster than parsing then validating) and their replies written with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field


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
    """A body that is not the wire format; ``loc`` names the field, as FastAPI's errors do."""

    def __init__(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error") -> None:
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.loc = loc
        self.msg = msg
        self.kind = kind

    def detail(self) -> list[dict[str, Any]]:
        """The error as a 422 reply's ``detail``."""
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


def read_args(body: bytes) -> ExtenderArgs:
    """Filter's and prioritize's body; ``WireError`` names the field and the rule it broke."""
    try:
        args = _read_args(body)
    except msgspec.ValidationError as err:
        # msgspec says "Expected `array`, got `str` - at `$.NodeNames`"
        msg, _, path = str(err).partition(" - at `$")
        loc = tuple(key or int(index) for key, index in _STEP.findall(path.rstrip("`")))
        raise WireError(("body", *loc), msg) from None
    except msgspec.DecodeError as err:
        raise WireError(("body",), f"not JSON: {err}", "json_invalid") from None
    nodes = None if args.Nodes is None else NodeList.model_construct(items=args.Nodes.items)
    # built without validation: msgspec has checked every type
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


class ExtenderBindingResult(_Wire):
    """Reply of bind; empty Error means bound."""

    Error: str = ""
