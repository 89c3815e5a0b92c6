"""The DRA ledger: who holds how much GPU memory and computing power, read from DRA objects.

In DRA mode the record of a share is the ResourceClaim's ``status.allocation`` (docs/dra.md), not
a pod annotation: each result names a driver, a pool (our node), a device (``gpu-<index>``) and
the ``consumedCapacity`` the API server's allocator, or gpushare's (``core.dra.allocate``),
recorded for it (KEP-5075; k8s.io/api v0.36 ``resource/v1`` ``DeviceRequestAllocationResult``).
The ResourceSlices say which GPUs each node has (``core.dra.slices.gpus_from_slice``).

``read_ledger`` turns both into the values the rest of gpushare already decides over, so there is
one home for each concept:

- per node, a ``NodeInventory`` (``core.model.inventory``) built from the slice and, when given,
  the Node object (its placement label, allocatable CPU and memory);
- per claim, a ``ClaimHolding`` whose ``allocation`` is a ``core.records.allocation.Allocation``
  (the claim's UID in place of a pod's), which ``DraLedger.book`` puts into a
  ``core.booking.ledger.Ledger`` (``Ledger.claim``), so the placement code, the
  fragmentation-aware policies and ``kubectl inspect cgpu`` see DRA holdings like any other;
- per node, the ``NodeUsage`` of ``core.booking.ledger`` (``DraLedger.usage``).

Trust rules (issue 60, item 4): only results of driver ``gpushare.io`` count; what counts is the
recorded ``consumedCapacity``, never what the claim's spec asked, so a tenant who writes its own
claim holds only what the API server granted (the API server's allocator rounds and bounds it by
the device's ``requestPolicy``; status is written by allocators, not by tenants). A result that
names a pool or device no slice publishes, or capacity this ledger cannot read, is reported in
``problems`` and not counted: the ledger never guesses where a share lives. A claim that holds
more than a GPU has is counted as recorded and reported (``over``), since the holding is real.

Pure: callers pass the objects as the API server returns them (dicts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpushare.core.booking.ledger import GpuUsage, Ledger, NodeUsage
from gpushare.core.dra.slices import SliceSpec, device_name, gpus_from_slice, index_of
from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.hostresources import NOTHING, node_allocatable
from gpushare.core.model.inventory import CORE_PER_GPU, NodeInventory, Placement
from gpushare.core.model.kubejson import KubeObject, labels_of, name_of, namespace_of, uid_of
from gpushare.core.model.names import (
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DRIVER,
    LABEL_PLACEMENT,
)
from gpushare.core.model.quantity import parse_quantity
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, ContainerShare, GpuShare

MIB = 1024 * 1024


@dataclass(frozen=True)
class PodRef:
    """A pod a claim is reserved for (``status.reservedFor``)."""

    name: str
    uid: str


@dataclass(frozen=True)
class ClaimShare:
    """One allocation result of a claim: what one request holds on one GPU."""

    request: str
    node: str
    index: int
    mem_units: int
    core_pct: int
    share_id: str = ""

    @property
    def device(self) -> str:
        """The device name in the node's slice."""
        return device_name(self.index)


@dataclass(frozen=True)
class ClaimHolding:
    """What one allocated claim holds, and for which pods."""

    uid: str
    namespace: str
    name: str
    node: str
    unit: MemoryUnit
    shares: tuple[ClaimShare, ...]
    pods: tuple[PodRef, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def allocation(self) -> Allocation:
        """The holding as gpushare's allocation record: per GPU the sum of the claim's results
        there, per request a container share (the webhook makes one request per container)."""
        per_gpu: dict[int, tuple[int, int]] = {}
        per_request: dict[str, list[GpuShare]] = {}
        for share in self.shares:
            mem, core = per_gpu.get(share.index, (0, 0))
            per_gpu[share.index] = (mem + share.mem_units, core + share.core_pct)
            per_request.setdefault(share.request, []).append(
                GpuShare(share.index, share.mem_units, share.core_pct)
            )
        return Allocation(
            uid=self.uid,
            namespace=self.namespace,
            name=self.name,
            node=self.node,
            unit=self.unit,
            gpus=tuple(GpuShare(i, m, c) for i, (m, c) in sorted(per_gpu.items())),
            containers=tuple(
                ContainerShare(name, ContainerKind.APP, tuple(gpus))
                for name, gpus in per_request.items()
            ),
            assigned=True,
        )


@dataclass(frozen=True)
class LedgerProblem:
    """A claim result the ledger did not count, and why (a sentence naming the field)."""

    claim: str
    """``namespace/name`` of the claim."""
    message: str


@dataclass(frozen=True)
class DraLedger:
    """Every gpushare GPU published in slices and every share held by allocated claims.

    Build it with ``read_ledger``. ``nodes`` are the slices read back, by node name;
    ``holdings`` the claims' shares in claim-UID order; ``problems`` what was not counted;
    ``over`` GPUs whose holdings exceed their memory or 100 % of computing power (counted all
    the same: the claims hold it).
    """

    nodes: Mapping[str, SliceSpec]
    holdings: tuple[ClaimHolding, ...]
    problems: tuple[LedgerProblem, ...] = ()
    over: tuple[str, ...] = ()
    _usage: dict[str, NodeUsage] = field(default_factory=dict, repr=False, compare=False)

    def usage(self, node: str) -> NodeUsage:
        """What is held on a node's GPUs (``core.booking.ledger.NodeUsage``: memory in the
        node's unit, percent of computing power, and how many claim results)."""
        known = self._usage.get(node)
        if known is not None:
            return known
        mem: dict[int, int] = {}
        core: dict[int, int] = {}
        count: dict[int, int] = {}
        held = []
        for holding in self.holdings:
            if holding.node != node:
                continue
            held.append(holding.allocation)
            for share in holding.shares:
                mem[share.index] = mem.get(share.index, 0) + share.mem_units
                core[share.index] = core.get(share.index, 0) + share.core_pct
                count[share.index] = count.get(share.index, 0) + 1
        usage = NodeUsage(
            gpus={i: GpuUsage(mem[i], core[i], count[i]) for i in mem},
            allocations=tuple(held),
        )
        self._usage[node] = usage
        return usage

    def holders(self, node: str, index: int) -> list[tuple[ClaimHolding, ClaimShare]]:
        """The claims (and their results) that hold a share of one GPU, in claim-UID order."""
        return [
            (holding, share)
            for holding in self.holdings
            if holding.node == node
            for share in holding.shares
            if share.index == index
        ]

    def inventory(self, node: str, node_object: KubeObject | None = None) -> NodeInventory:
        """The node as the placement code reads it: GPUs, unit and sharing mode from its
        slice, the placement label and allocatable CPU and memory from the Node when given."""
        spec = self.nodes[node]
        labels = labels_of(node_object) if node_object is not None else {}
        return NodeInventory(
            name=node,
            ip="",
            mode=spec.mode,
            placement=Placement.from_label(labels.get(LABEL_PLACEMENT)),
            unit=spec.unit,
            gpus=spec.gpus,
            unit_declared=True,
            host=node_allocatable(node_object) if node_object is not None else NOTHING,
            model=next((g.model for g in spec.gpus if g.model), ""),
            published=True,
        )

    def book(self, ledger: Ledger) -> None:
        """Put every claim's holding into a ``Ledger`` (``Ledger.claim``); claims it held that
        are no longer allocated are dropped."""
        current = {holding.uid for holding in self.holdings}
        for stale in [a.uid for a in ledger.claims() if a.uid not in current]:
            ledger.unclaim(stale)
        for holding in self.holdings:
            ledger.claim(holding.allocation)


def _amount(raw: Any) -> Fraction | None:
    parsed = parse_quantity(raw)
    if isinstance(parsed, str) or parsed.value < 0:
        return None
    return parsed.value


def memory_units(raw: Any, unit: MemoryUnit) -> int | None:
    """A memory quantity in whole units of ``unit``; None when it is unreadable or not a whole
    number of units (the allocator rounds requests to the unit, so anything else is not ours)."""
    amount = _amount(raw)
    if amount is None:
        return None
    units = amount / (unit.mib * MIB)
    return int(units) if units.denominator == 1 else None


def read_holding(
    claim: KubeObject, nodes: Mapping[str, SliceSpec]
) -> tuple[ClaimHolding | None, list[LedgerProblem]]:
    """One claim's holding of gpushare GPUs, with the results not counted and why; None when
    it holds none (not allocated, or only other drivers' devices)."""
    key = f"{namespace_of(claim)}/{name_of(claim)}"
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results")) or []
    shares: list[ClaimShare] = []
    problems: list[LedgerProblem] = []
    where_node = ""
    for position, result in enumerate(results):
        if not isinstance(result, Mapping) or result.get("driver") != DRA_DRIVER:
            continue
        here = f"status.allocation.devices.results[{position}]"
        pool = str(result.get("pool", ""))
        device = str(result.get("device", ""))
        spec = nodes.get(pool)
        index = index_of(device)
        if spec is None:
            problems.append(
                LedgerProblem(
                    key,
                    f"{here}.pool={pool!r}: no gpushare ResourceSlice publishes "
                    "this pool; the share is not counted until the node's driver publishes it",
                )
            )
            continue
        gpu = next((g for g in spec.gpus if g.index == index), None) if index is not None else None
        if gpu is None:
            problems.append(
                LedgerProblem(
                    key,
                    f"{here}.device={device!r}: node {pool}'s slice publishes no "
                    "such device (out of service or never there); the share is not counted",
                )
            )
            continue
        consumed = result.get("consumedCapacity") or {}
        if DRA_CAPACITY_MEMORY in consumed:
            mem = memory_units(consumed[DRA_CAPACITY_MEMORY], spec.unit)
        else:
            mem = gpu.mem_units  # no consumed capacity recorded: the device's default, all of it
        core_raw = consumed.get(DRA_CAPACITY_CORES, 0)
        core_amount = _amount(core_raw)
        if mem is None or core_amount is None or core_amount.denominator != 1:
            problems.append(
                LedgerProblem(
                    key,
                    f"{here}.consumedCapacity={dict(consumed)!r}: memory must be "
                    f"whole units of {spec.unit.value} and cores a whole percent; not counted",
                )
            )
            continue
        if where_node and pool != where_node:
            problems.append(
                LedgerProblem(
                    key,
                    f"{here}.pool={pool!r}: the claim also holds GPUs on "
                    f"{where_node}; gpushare claims hold one node, this result is not counted",
                )
            )
            continue
        where_node = pool
        shares.append(
            ClaimShare(
                request=str(result.get("request", "")),
                node=pool,
                index=gpu.index,
                mem_units=mem,
                core_pct=int(core_amount),
                share_id=str(result.get("shareID", "")),
            )
        )
    if not shares:
        return None, problems
    pods = tuple(
        PodRef(str(ref.get("name", "")), str(ref.get("uid", "")))
        for ref in status.get("reservedFor") or []
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and not ref.get("apiGroup")
    )
    return (
        ClaimHolding(
            uid=uid_of(claim),
            namespace=namespace_of(claim),
            name=name_of(claim),
            node=where_node,
            unit=nodes[where_node].unit,
            shares=tuple(shares),
            pods=pods,
        ),
        problems,
    )


def read_ledger(slices: Iterable[KubeObject], claims: Iterable[KubeObject]) -> DraLedger:
    """The ledger the slices and claims make (see the module docstring)."""
    nodes: dict[str, SliceSpec] = {}
    for obj in slices:
        spec = gpus_from_slice(dict(obj))
        if spec is not None:
            nodes[spec.node] = spec
    holdings: list[ClaimHolding] = []
    problems: list[LedgerProblem] = []
    for claim in claims:
        holding, found = read_holding(claim, nodes)
        problems += found
        if holding is not None:
            holdings.append(holding)
    holdings.sort(key=lambda h: h.uid)
    ledger = DraLedger(nodes=nodes, holdings=tuple(holdings), problems=tuple(problems))
    over: list[str] = []
    for name, spec in sorted(nodes.items()):
        usage = ledger.usage(name)
        for gpu in spec.gpus:
            held = usage.on(gpu.index)
            if held.mem_units > gpu.mem_units or held.core_pct > CORE_PER_GPU:
                over.append(
                    f"node {name} GPU{gpu.index}: claims hold {held.mem_units}/{gpu.mem_units} "
                    f"units of {spec.unit.value} and {held.core_pct}/{CORE_PER_GPU}% computing "
                    "power"
                )
    return DraLedger(
        nodes=nodes, holdings=tuple(holdings), problems=tuple(problems), over=tuple(over)
    )
