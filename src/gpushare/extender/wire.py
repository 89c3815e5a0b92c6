"""The extender wire format (k8s.io/kube-scheduler/extender/v1), spelled exactly.

The Go types carry no json tags, so every key is the Go field name in PascalCase. Nodes, when
sent (caches off), are a ``v1.NodeList`` in ordinary Kubernetes JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json


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


def priorities_json(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """Prioritize's reply written straight from names and scores.

    Thousands of entries per call: a model per entry would cost more than the decision.
    """
    return to_json([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])


class ExtenderBindingArgs(_Wire):
    """Body of bind."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(_Wire):
    """Reply of bind; empty Error means bound."""

    Error: str = ""
