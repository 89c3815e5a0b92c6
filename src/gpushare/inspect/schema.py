"""The JSON documents ``kubectl inspect cgpu -o json`` prints, as models with a JSON Schema.

One key style everywhere: camelCase as pydantic's ``to_camel`` spells it (``totalUnits``,
``unitMib``, ``boundTo``), for the summary, ``-d``, ``--explain`` and the extender's
``GET /inspect`` alike, so a script written against one reads the others. The models are the
documentation: ``kubectl inspect cgpu --schema summary`` (or ``explain``) prints their JSON
Schema, and every document is built through them, so output and schema cannot drift apart.
Maps keyed by GPU index (``memUnits``, ``corePercent``) use the index as a string key, as JSON
requires.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

SCHEMA_VERSION: Literal[1] = 1


class _Doc(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class GpuDoc(_Doc):
    """One GPU: its memory and what pods hold on it."""

    index: int = Field(description="The GPU's index on its node (GPU0, GPU1, ...).")
    total_units: int = Field(description="Memory of the GPU, in the node's unit.")
    allocated_units: int = Field(description="Memory pods hold on it, in the node's unit.")
    core_allocated_percent: int = Field(
        description="Computing power held on it, in percent (core_mem nodes)."
    )
    pods: int = Field(description="Pods holding a share of it.")
    healthy: bool
    model: str = Field(description="GPU model as the device plugin reports it, or empty.")
    out_of_service: bool = Field(
        default=False,
        description="Taken out of service by the node's gpushare.io/gpus-disabled annotation: "
        "its pods keep running, no new pod is placed on it.",
    )


class PodDoc(_Doc):
    """One pod's holding on a node."""

    namespace: str
    name: str
    mem_units: dict[str, int] = Field(description="Memory per GPU index, in the node's unit.")
    core_percent: dict[str, int] = Field(description="Computing power per GPU index, percent.")
    pending_units: int = Field(description="Memory held on a GPU gpushare does not know.")
    state: Literal["assumed", "bound", "assigned", "unplaced"] = Field(
        description="assumed: bind in flight; bound; assigned: served by the device plugin; "
        "unplaced: holds memory but carries no GPU record."
    )
    resource_policy: str = Field(
        default="",
        description="The ResourcePolicy (in the pod's namespace) that placed the pod, or empty.",
    )
    policy_unit: int = Field(
        default=0,
        description="The unit of that policy the pod was placed in, counting from 1; 0 when no "
        "policy placed it.",
    )


class NodeDoc(_Doc):
    """One node shown by inspect."""

    name: str
    ip: str = Field(description="The node's InternalIP, or empty.")
    mode: str = Field(description="ack.node.gpu.schedule: share, cgpu, core_mem, mps or none.")
    unit: Literal["1GiB", "128MiB"] = Field(description="The node's gpu-mem unit.")
    unit_mib: int = Field(description="Size of one unit in MiB (1024 or 128).")
    gpus: list[GpuDoc]
    pods: list[PodDoc]
    pending_units: int = Field(description="Memory held on unknown GPUs, in the node's unit.")
    problem: str = Field(description="Why gpushare cannot read the node, or empty.")
    total_units: int = Field(description="Memory of all its GPUs, in the node's unit.")
    allocated_units: int = Field(description="Memory held on it (pending included).")
    seen_from: Literal["node", "pods"] = Field(
        default="node",
        description="node: read from the Node object; pods: the reader may not read nodes, so "
        "the node is described from its pods' allocations (only the GPUs they hold, mode none).",
    )
    used_mib: dict[str, int] = Field(
        default_factory=dict,
        description="GPU memory its containers' processes hold now, in MiB per GPU index, as the "
        "node's device plugin last published it (the node's gpushare.io/gpu-used, read at "
        "usedAt); empty where none is published: share and mps nodes, older plugins, and a "
        "view that cannot read nodes.",
    )
    used_at: str = Field(
        default="",
        description="When the device plugin read usedMib (UTC, RFC 3339), or empty.",
    )


class IgnoredDoc(_Doc):
    """An allocation annotation gpushare does not count, and why."""

    namespace: str
    name: str
    node: str = Field(description="The node the annotation names.")
    reason: str


class ClusterDoc(_Doc):
    """Cluster totals in MiB (nodes may count in different units)."""

    total_mib: int
    allocated_mib: int
    allocated_percent: int = Field(description="Truncated, as the table prints it.")


class ScopeDoc(_Doc):
    """Which pods the document shows and what its reader could not see."""

    namespace: str = Field(
        default="", description="Only this namespace's pods (-n); empty: every namespace."
    )
    selector: str = Field(default="", description="The label selector given with -l, or empty.")
    forbidden: list[str] = Field(
        default_factory=list,
        description="What the reader's rights hid ('nodes', 'pods outside namespace X', "
        "'resourceslices', 'resourceclaims'); when "
        "pods are hidden, allocated amounts count only the pods of the namespace it may list.",
    )


class InspectDocument(_Doc):
    """``kubectl inspect cgpu -o json`` (with or without ``-d``) and ``GET /inspect``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    unit: Literal["1GiB", "128MiB"] = Field(
        description="The unit read for nodes that do not declare theirs."
    )
    nodes: list[NodeDoc]
    ignored: list[IgnoredDoc]
    cluster: ClusterDoc
    unlabelled_nodes: list[str] = Field(
        description="Nodes with GPU memory but no ack.node.gpu.schedule value gpushare knows: "
        "nothing is placed there until the label is added."
    )
    scope: ScopeDoc = Field(
        default_factory=ScopeDoc,
        description="With -n or -l, the nodes listed are those holding a pod in scope, with "
        "their full totals, and each node's pods are those in scope.",
    )


class NodeExplanationDoc(_Doc):
    """One node's answer for the explained pod."""

    node: str
    fits: Literal["yes", "no", "never"] = Field(
        description="yes: fits now; no: could fit once something frees up; never: not on this "
        "node as it is."
    )
    gpus: list[int] = Field(description="GPUs the pod would get (when it fits).")
    score: int = Field(description="The extender's score 0..10 (when it fits).")
    reasons: list[str] = Field(description="Why it does not fit.")
    placement: str = Field(description="Where it would go and how full (when it fits).")


class ExplainDocument(_Doc):
    """``kubectl inspect cgpu --explain POD -o json``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    namespace: str
    name: str
    phase: str
    bound_to: str = Field(description="The node the pod is bound to, or empty.")
    asks: str = Field(description="What the pod asks for, in words.")
    nodes: list[NodeExplanationDoc]
    verdict: str = Field(description="One line: the best node, or the refusals per reason.")
    rejection: list[str] = Field(description="Why the request itself is invalid, or empty.")
    new_node: str = Field(
        default="",
        description="When no node fits: whether a gpushare placeholder asks an autoscaler for a "
        "new node for the pod (its name and GPUs), or why none does; empty otherwise.",
    )


DOCUMENTS: dict[str, type[_Doc]] = {"summary": InspectDocument, "explain": ExplainDocument}
"""The documents by the name ``--schema`` takes."""


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one document, keys as they appear in the output."""
    schema = DOCUMENTS[name].model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def dump(document: _Doc) -> dict[str, Any]:
    """A document as plain JSON data, camelCase keys."""
    return document.model_dump(by_alias=True, mode="json")
