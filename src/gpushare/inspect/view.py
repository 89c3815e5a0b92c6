"""What ``kubectl inspect cgpu`` shows, built from inventories and the ledger alone (pure).

The extender's ``GET /inspect`` returns the same view as JSON, so a person and a dashboard see
the same numbers. Nodes appear when they are shared (a known mode with GPUs) or hold anything.
Allocations the ledger ignored (core.records.trust: not sealed by gpushare for their pod, bound
elsewhere, or not matching the pod) are listed apart with the reason: they hold nothing. Nodes
with GPUs but no sharing mode label are named apart too: gpushare places nothing there until the
label is added, which is the first thing to check when a pod stays Pending.
A pod a ResourcePolicy placed carries the policy and unit its bind recorded (``units``, by pod
UID, from ``core.resourcepolicies.policybook.recorded_units``), so the view says which pool each
pod went to.
In DRA mode (docs/dra.md) the nodes are those the ResourceSlices publish and the holdings are
the claims' allocations (``inspect.dramode``): they are booked into the same ledger and shown
the same way, each under the name of the pod its claim is reserved for.
A view can be narrowed to the pods in a scope (``inspect.scope``: a namespace, a label
selector): it then shows those pods and the nodes they are on, with the nodes' full totals, and
it records what its reader could not see, so the renderers can say it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import CORE_PER_GPU, Mode, NodeInventory
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.gpuuse import UsedSummary
from gpushare.inspect.dramode import DraView
from gpushare.inspect.schema import (
    ClusterDoc,
    GpuDoc,
    IgnoredDoc,
    InspectDocument,
    NodeDoc,
    PodDoc,
    ScopeDoc,
    dump,
)
from gpushare.inspect.scope import ALL_VISIBLE, EVERY_POD, Scope, Sight


@dataclass(frozen=True)
class PodView:
    """One pod's holding on a node."""

    namespace: str
    name: str
    mem_units: Mapping[int, int]
    core_pct: Mapping[int, int]
    pending_units: int = 0
    """Memory held on an unknown GPU."""
    state: str = "bound"
    """``assumed`` (bind in flight), ``bound``, ``assigned`` (served by the device plugin) or
    ``unplaced`` (holds memory but carries no GPU record)."""
    policy: str = ""
    """The ResourcePolicy (name, in the pod's namespace) whose unit the pod was placed in."""
    unit: int = 0
    """That unit's number, from 1; 0 when no policy placed the pod."""


@dataclass(frozen=True)
class GpuView:
    """One GPU's totals."""

    index: int
    total_units: int
    allocated_units: int
    core_allocated_pct: int
    pods: int
    healthy: bool
    model: str = ""
    out_of_service: bool = False
    """Taken out of service by the operator (``core.model.disabling``)."""


@dataclass(frozen=True)
class NodeView:
    """One node's GPUs and pods."""

    name: str
    ip: str
    mode: Mode
    unit: str
    unit_mib: int
    gpus: tuple[GpuView, ...]
    pods: tuple[PodView, ...]
    pending_units: int = 0
    problem: str = ""
    seen_from_pods: bool = False
    """The node could not be read: its GPUs are those the reader's pods hold, its mode unknown."""
    used: UsedSummary | None = None
    """GPU memory in use per GPU, as the node's device plugin last published it
    (core.records.gpuuse)."""

    @property
    def total_units(self) -> int:
        """Memory of all GPUs."""
        return sum(g.total_units for g in self.gpus)

    @property
    def allocated_units(self) -> int:
        """Memory held on the node, pending included."""
        return sum(g.allocated_units for g in self.gpus) + self.pending_units

    @property
    def core_capacity_pct(self) -> int:
        """Computing power of all GPUs (core_mem nodes)."""
        return CORE_PER_GPU * len(self.gpus)

    @property
    def core_allocated_pct(self) -> int:
        """Computing power held on the node."""
        return sum(g.core_allocated_pct for g in self.gpus)


@dataclass(frozen=True)
class IgnoredView:
    """A pod whose allocation annotation does not count, and why."""

    namespace: str
    name: str
    node: str
    """The node its record names."""
    reason: str


@dataclass(frozen=True)
class ClusterView:
    """Every shared node."""

    nodes: tuple[NodeView, ...]
    ignored: tuple[IgnoredView, ...] = ()
    unit: str = MemoryUnit.GiB.value
    """The unit read for nodes that do not declare theirs."""
    unlabelled: tuple[str, ...] = ()
    """Nodes with GPUs whose ``ack.node.gpu.schedule`` is missing or not a mode gpushare knows."""
    scope: Scope = EVERY_POD
    """The pods asked for; the nodes shown are theirs when it narrows."""
    sight: Sight = ALL_VISIBLE
    """What the reader's rights let it read."""

    @property
    def whole(self) -> bool:
        """Whether this is the whole cluster (the seeds' view): nothing narrowed or hidden."""
        return not self.scope.narrowed and self.sight.whole

    @property
    def has_policies(self) -> bool:
        """Whether some pod was placed by a ResourcePolicy (then ``-d`` shows the units)."""
        return any(p.unit for n in self.nodes for p in n.pods)

    @property
    def mixed_units(self) -> bool:
        """Whether nodes count memory in different units (then totals are shown in MiB)."""
        return len({n.unit for n in self.nodes}) > 1

    def total_mib(self) -> int:
        """Cluster memory in MiB."""
        return sum(n.total_units * n.unit_mib for n in self.nodes)

    def allocated_mib(self) -> int:
        """Cluster memory held, in MiB."""
        return sum(n.allocated_units * n.unit_mib for n in self.nodes)


def build_view(
    nodes: Iterable[NodeInventory],
    ledger: Ledger,
    *,
    unit: MemoryUnit = MemoryUnit.GiB,
    units: Mapping[str, tuple[str, int]] | None = None,
    scope: Scope = EVERY_POD,
    selected: frozenset[str] | None = None,
    sight: Sight = ALL_VISIBLE,
    used: Mapping[str, UsedSummary | None] | None = None,
    dra: DraView | None = None,
) -> ClusterView:
    """Join inventories, holdings, recorded policy units and published use into the view.

    ``selected``: the UIDs of the pods in ``scope`` (``scope.selected_uids``); None shows all.
    ``dra``: DRA mode's claims (``inspect.dramode``), already booked into ``ledger`` and their
    nodes among ``nodes``: shown under their pods' names, in scope with their pods.
    """
    units = units or {}
    used = used or {}
    busy = ledger.nodes()
    views = []
    nodes = sorted(nodes, key=lambda n: n.name)
    claimed = dra.names if dra is not None else {}
    dra_nodes = dra.inventories if dra is not None else {}
    unlabelled = tuple(
        n.name
        for n in nodes
        if n.mode is Mode.NONE
        and n.gpus
        and selected is None
        and sight.nodes
        and n.name not in dra_nodes
    )

    def shown(uid: str) -> bool:
        if dra is not None and uid in claimed:
            return dra.shown(uid, selected)
        return selected is None or uid in selected

    def named(namespace: str, name: str, uid: str) -> tuple[str, str]:
        return claimed.get(uid, (namespace, name))

    for node in nodes:
        if not (node.mode is not Mode.NONE and node.gpus) and node.name not in busy:
            continue
        usage = ledger.usage(node.name)
        uids = [a.uid for a in usage.allocations] + [u.uid for u in usage.unplaced]
        if selected is not None and not any(shown(uid) for uid in uids):
            continue
        gpus = tuple(
            GpuView(
                index=g.index,
                total_units=g.mem_units,
                allocated_units=usage.on(g.index).mem_units,
                core_allocated_pct=usage.on(g.index).core_pct,
                pods=usage.on(g.index).pods,
                healthy=g.healthy,
                model=g.model,
                out_of_service=g.disabled,
            )
            for g in node.gpus
        )
        pods = [
            PodView(
                namespace=named(a.namespace, a.name, a.uid)[0],
                name=named(a.namespace, a.name, a.uid)[1],
                mem_units={s.index: s.mem_units for s in a.gpus},
                core_pct={s.index: s.core_pct for s in a.gpus if s.core_pct},
                state="assumed"
                if ledger.is_assumed(a.uid)
                else ("assigned" if a.assigned else "bound"),
                policy=units.get(a.uid, ("", 0))[0],
                unit=units.get(a.uid, ("", 0))[1],
            )
            for a in usage.allocations
            if shown(a.uid)
        ]
        pods += [
            PodView(
                namespace=u.namespace,
                name=u.name,
                mem_units={},
                core_pct={},
                pending_units=u.mem_units,
                state="unplaced",
            )
            for u in usage.unplaced
            if shown(u.uid)
        ]
        views.append(
            NodeView(
                name=node.name,
                ip=node.ip,
                mode=node.mode,
                unit=node.unit.value,
                unit_mib=node.unit.mib,
                gpus=gpus,
                pods=tuple(sorted(pods, key=lambda p: (p.namespace, p.name))),
                pending_units=usage.unplaced_mem_units,
                problem=node.problem,
                seen_from_pods=not sight.nodes,
                used=used.get(node.name),
            )
        )
    ignored_views = [
        IgnoredView(namespace=i.namespace, name=i.name, node=i.node, reason=i.why.message)
        for i in ledger.ignored()
        if shown(i.uid)
    ]
    if dra is not None:
        ignored_views += [
            IgnoredView(namespace=i.namespace, name=i.name, node=i.node, reason=i.reason)
            for i in dra.ignored
            if selected is None or i.pods & selected
        ]
    ignored = tuple(sorted(ignored_views, key=lambda i: (i.namespace, i.name)))
    return ClusterView(
        nodes=tuple(views),
        ignored=ignored,
        unit=unit.value,
        unlabelled=unlabelled,
        scope=scope,
        sight=sight,
    )


def to_json(view: ClusterView) -> dict[str, Any]:
    """The view as plain JSON (``-o json`` and ``GET /inspect``; ``inspect.schema``)."""
    total, allocated = view.total_mib(), view.allocated_mib()
    document = InspectDocument(
        unit=view.unit,  # type: ignore[arg-type]  # a MemoryUnit value, checked by the model
        nodes=[
            NodeDoc(
                name=node.name,
                ip=node.ip,
                mode=node.mode.value,
                unit=node.unit,  # type: ignore[arg-type]
                unit_mib=node.unit_mib,
                gpus=[
                    GpuDoc(
                        index=g.index,
                        total_units=g.total_units,
                        allocated_units=g.allocated_units,
                        core_allocated_percent=g.core_allocated_pct,
                        pods=g.pods,
                        healthy=g.healthy,
                        model=g.model,
                        out_of_service=g.out_of_service,
                    )
                    for g in node.gpus
                ],
                pods=[
                    PodDoc(
                        namespace=p.namespace,
                        name=p.name,
                        mem_units={str(k): v for k, v in p.mem_units.items()},
                        core_percent={str(k): v for k, v in p.core_pct.items()},
                        pending_units=p.pending_units,
                        state=p.state,  # type: ignore[arg-type]
                        resource_policy=p.policy,
                        policy_unit=p.unit,
                    )
                    for p in node.pods
                ],
                pending_units=node.pending_units,
                problem=node.problem,
                total_units=node.total_units,
                allocated_units=node.allocated_units,
                seen_from="pods" if node.seen_from_pods else "node",
                used_mib={} if node.used is None else dict(node.used.used_mib),
                used_at="" if node.used is None else node.used.at,
            )
            for node in view.nodes
        ],
        ignored=[
            IgnoredDoc(namespace=i.namespace, name=i.name, node=i.node, reason=i.reason)
            for i in view.ignored
        ],
        cluster=ClusterDoc(
            total_mib=total,
            allocated_mib=allocated,
            allocated_percent=(allocated * 100 // total) if total else 0,
        ),
        unlabelled_nodes=list(view.unlabelled),
        scope=ScopeDoc(
            namespace=view.scope.namespace,
            selector=view.scope.selector.text,
            forbidden=list(view.sight.hidden()),
        ),
    )
    return dump(document)
