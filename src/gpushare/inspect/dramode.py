"""DRA mode in ``kubectl inspect cgpu``'s view: nodes from ResourceSlices, holdings from claims.

In DRA mode (docs/dra.md) a node carries no gpushare inventory annotation and a pod no
allocation annotation: the node's GPUs are in its ResourceSlice and each share is a
ResourceClaim's ``status.allocation``. ``core.dra.ledger.read_ledger`` reads both under the
ledger's trust rules (only driver gpushare.io's results count, and only the capacity the
allocator recorded); this module turns its result into what ``inspect.view.build_view`` already
joins, so a DRA node is shown exactly as a device-plugin node is:

- an inventory per published node (``DraLedger.inventory``), with the address of its Node
  object when the reader may list nodes;
- each claim's holding booked into the same ``core.booking.ledger.Ledger`` (``DraLedger.book``),
  shown under the name of the pod it is reserved for (``status.reservedFor``), else the claim's;
- each result the ledger did not count, as an ignored allocation with the ledger's reason.

A reader who may not list ResourceSlices (a tenant: they are cluster-scoped) gets the nodes as
its claims describe them, as ``inspect.scope.nodes_from_pods`` does for pods: the GPUs its
claims hold, each as large as the most held on it, in the unit asked for.

Pure: the callers list the objects (``inspect.cli.collect``, the extender's ``GET /inspect`` and
its metrics) and pass them as the API server returns them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpushare.core.booking.ledger import Ledger
from gpushare.core.dra.ledger import DraLedger, read_holding, read_ledger
from gpushare.core.dra.slices import SliceSpec, index_of
from gpushare.core.model.inventory import Gpu, Mode, NodeInventory, read_node
from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of, uid_of
from gpushare.core.model.names import DRA_DRIVER
from gpushare.core.model.units import MemoryUnit

UNSIZED = 1 << 40
"""A GPU size no holding reaches: GPUs read from claims alone are sized afterwards."""


@dataclass(frozen=True)
class DraIgnored:
    """A claim result the DRA ledger did not count (``core.dra.ledger.LedgerProblem``)."""

    namespace: str
    name: str
    """The pod the claim is reserved for, else the claim's name."""
    node: str
    """The pool (node) its first gpushare result names."""
    reason: str
    pods: frozenset[str] = frozenset()
    """UIDs of the pods the claim is reserved for."""


@dataclass(frozen=True)
class DraView:
    """DRA mode's part of the view (see the module docstring)."""

    ledger: DraLedger
    inventories: Mapping[str, NodeInventory]
    """Per node name, the node as its slice (or, unread, its claims) describes it."""
    names: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Per claim UID, the (namespace, name) shown: the pod the claim is reserved for."""
    pods: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per claim UID, the UIDs of the pods it is reserved for (for ``-n``/``-l``)."""
    ignored: tuple[DraIgnored, ...] = ()
    from_claims: bool = False
    """The slices could not be read: the nodes are what the claims hold."""

    @property
    def present(self) -> bool:
        """Whether the cluster shows any DRA mode (a published node or a gpushare claim)."""
        return bool(self.inventories or self.ledger.holdings or self.ignored)

    def book(self, ledger: Ledger) -> None:
        """Put every counted claim into ``ledger`` (``DraLedger.book``)."""
        self.ledger.book(ledger)

    def shown(self, claim_uid: str, selected: frozenset[str] | None) -> bool:
        """Whether a claim is in scope: one of its pods is (``selected``: pod UIDs)."""
        return selected is None or bool(self.pods.get(claim_uid, frozenset()) & selected)

    def merge(self, inventories: Iterable[NodeInventory]) -> list[NodeInventory]:
        """``inventories`` with each DRA node's in place of what its Node object said (no
        inventory annotation: no GPUs), and the DRA nodes no Node object was read for."""
        out = []
        seen = set()
        for inventory in inventories:
            dra = self.inventories.get(inventory.name)
            if dra is None:
                out.append(inventory)
            else:
                out.append(dra)
                seen.add(inventory.name)
        out += [inv for name, inv in sorted(self.inventories.items()) if name not in seen]
        return out


def _pods_of(claim: KubeObject) -> list[tuple[str, str]]:
    """(name, uid) of the pods in ``status.reservedFor``."""
    refs = (claim.get("status") or {}).get("reservedFor") or []
    return [
        (str(r.get("name", "")), str(r.get("uid", "")))
        for r in refs
        if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup")
    ]


def _results(claim: KubeObject) -> list[Mapping[str, object]]:
    """The claim's allocation results of driver gpushare.io."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER]


def _shown_name(claim: KubeObject) -> str:
    pods = _pods_of(claim)
    return pods[0][0] if pods and pods[0][0] else name_of(claim)


def specs_from_claims(claims: Iterable[KubeObject], unit: MemoryUnit) -> dict[str, SliceSpec]:
    """What claims say of nodes whose slices cannot be read: per pool, the GPUs its results
    name, unsized (``UNSIZED``), in ``unit``; the mode is unknown."""
    indexes: dict[str, set[int]] = {}
    for claim in claims:
        for result in _results(claim):
            index = index_of(str(result.get("device", "")))
            pool = str(result.get("pool", ""))
            if index is not None and pool:
                indexes.setdefault(pool, set()).add(index)
    return {
        pool: SliceSpec(
            node=pool,
            unit=unit,
            mode=Mode.NONE,
            gpus=tuple(Gpu(index=i, mem_units=UNSIZED) for i in sorted(found)),
        )
        for pool, found in sorted(indexes.items())
    }


def read_dra(
    slices: Iterable[KubeObject] | None,
    claims: Iterable[KubeObject],
    nodes: Iterable[KubeObject] | None,
    *,
    unit: MemoryUnit = MemoryUnit.GiB,
) -> DraView:
    """DRA mode's part of the view.

    ``slices``: gpushare's ResourceSlices, None when the reader may not list them (the nodes
    are then what the claims hold, in ``unit``); ``nodes``: the Node objects the reader may
    list (their address and placement label), None when none.
    """
    claims = list(claims)
    by_name = {name_of(n): n for n in nodes or ()}
    from_claims = slices is None
    if slices is None:
        specs = specs_from_claims(claims, unit)
        holdings = []
        for claim in claims:
            holding, _ = read_holding(claim, specs)
            if holding is not None:
                holdings.append(holding)
        holdings.sort(key=lambda h: h.uid)
        ledger = DraLedger(nodes=specs, holdings=tuple(holdings))
        specs = {
            name: replace(
                spec,
                gpus=tuple(
                    replace(g, mem_units=ledger.usage(name).on(g.index).mem_units)
                    for g in spec.gpus
                ),
            )
            for name, spec in specs.items()
        }
        ledger = DraLedger(nodes=specs, holdings=ledger.holdings)
    else:
        ledger = read_ledger(slices, claims)
    inventories = {}
    for name in ledger.nodes:
        node = by_name.get(name)
        inventory = ledger.inventory(name, node)
        if node is not None:
            inventory = replace(inventory, ip=read_node(node).ip)
        inventories[name] = inventory
    by_key = {f"{namespace_of(c)}/{name_of(c)}": c for c in claims}
    names = {}
    pods = {}
    for claim in claims:
        uid = uid_of(claim)
        names[uid] = (namespace_of(claim), _shown_name(claim))
        pods[uid] = frozenset(pod_uid for _, pod_uid in _pods_of(claim))
    ignored = []
    if not from_claims:
        for problem in ledger.problems:
            found = by_key.get(problem.claim)
            if found is None:
                continue
            results = _results(found)
            ignored.append(
                DraIgnored(
                    namespace=namespace_of(found),
                    name=_shown_name(found),
                    node=str(results[0].get("pool", "")) if results else "",
                    reason=f"ResourceClaim {problem.claim}: {problem.message}",
                    pods=pods.get(uid_of(found), frozenset()),
                )
            )
    return DraView(
        ledger=ledger,
        inventories=inventories,
        names=names,
        pods=pods,
        ignored=tuple(ignored),
        from_claims=from_claims,
    )
