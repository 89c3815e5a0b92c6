"""Which GPU nodes an autoscaler must not take away: the scale-down guard.

cluster-autoscaler judges a node without a vendor GPU resource by CPU and memory alone
(``simulator/utilization/info.go``), so a node whose GPUs are full and whose CPUs idle is
"underutilized"; and it re-places the node's pods in simulation by node-level totals
(``simulator/cluster.go`` ``findPlaceFor``), with no drain rule about extended resources
(``simulator/drainability/rules/rules.go``), so it may evict shared-GPU pods onto nodes where
no single GPU holds them (../shared/docs/AUTOSCALERS.md 1a). Karpenter's consolidation packs by
totals the same way (1c).

The guard decides, node by node, what gpushare knows and they do not:

- a node whose GPU memory is used at or above ``threshold`` (cluster-autoscaler's own default
  utilization threshold, 0.5) is needed, as CA would judge a node with a vendor GPU;
- a node below it is needed when gpushare could not place its pods again, GPU by GPU, on the
  other nodes of its pool (the same mode, unit and GPU model): best fit, largest first, into
  the free room each GPU has. Nodes are tried least used first, and a node found removable
  takes the room its pods would use and gives none of its own, so two nodes are never both
  freed by counting the same room twice;
- a node holding no GPU pod is never guarded: an empty GPU node is for the autoscaler to
  remove.

The adapter writes the answer as the opt-outs both autoscalers read: the node annotations
``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` (CA FAQ; ``utils/...``
``ScaleDownDisabledKey``) and ``karpenter.sh/do-not-disrupt: "true"`` (Karpenter v1), with a
marker of its own so it only ever removes what it wrote.

In DRA mode (docs/dra.md) the same decision reads allocated claims instead of pods:
``dra_guards`` takes the nodes from their ResourceSlices and the usage from the claims'
recorded ``consumedCapacity`` (``core.dra.ledger.DraLedger``), one claim standing where a pod
stands. cluster-autoscaler 1.36 already re-places claims GPU by GPU itself (docs/autoscaling.md,
DRA mode); Karpenter does not, as it ignores DRA requests by default.

Pure: inventories and the ledger in, one ``Guard`` per GPU node out.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpushare.core.booking.ledger import NodeUsage
from gpushare.core.dra.ledger import DraLedger
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.kubejson import KubeObject
from gpushare.core.records.allocation import Allocation

CA_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ANN_GUARD = "gpushare.io/scale-down-guard"
"""gpushare's marker: present when gpushare set the two opt-outs, with the reason."""
THRESHOLD = 0.5
"""cluster-autoscaler's ``--scale-down-utilization-threshold`` default."""


@dataclass(frozen=True)
class Guard:
    """Whether one node must stay, and why (empty reason: it may go)."""

    node: str
    needed: bool
    reason: str


class Usages(Protocol):
    """What the guard reads of a ledger: each node's usage (``core.booking.ledger.Ledger`` in
    device-plugin mode, ``core.dra.ledger.DraLedger`` in DRA mode)."""

    def usage(self, node: str) -> NodeUsage: ...


def _pool(node: NodeInventory) -> tuple[object, ...]:
    return (node.mode.value, node.unit.value, node.model)


def guards(
    nodes: Mapping[str, NodeInventory], ledger: Usages, *, threshold: float = THRESHOLD
) -> dict[str, Guard]:
    """One ``Guard`` per node that has GPUs. ``nodes`` are of one allocation mode: a pod of
    one mode cannot move to a node of the other."""
    if not 0 < threshold <= 1:
        raise ValueError(
            f"autoscaling.scaleDownUtilizationThreshold={threshold} is refused: it must be "
            f"above 0 and at most 1 (cluster-autoscaler's default is 0.5)"
        )
    used: dict[str, float] = {}
    pools: dict[tuple[object, ...], _Room] = {}
    out: dict[str, Guard] = {}
    for name, node in nodes.items():
        if not node.gpus or not node.mem_units_total:
            continue
        usage = ledger.usage(name)
        used[name] = usage.mem_units / node.mem_units_total
        room = pools.setdefault(_pool(node), _Room())
        for g in node.gpus:
            if g.in_service:
                held = usage.on(g.index)
                room.add(name, g.index, g.mem_units - held.mem_units, g.core_pct - held.core_pct)
    for name in sorted(used, key=lambda n: (used[n], n)):
        share = used[name]
        usage = ledger.usage(name)
        if not usage.allocations and not usage.mem_units:
            out[name] = Guard(name, False, "")
            continue
        if share >= threshold:
            out[name] = Guard(
                name,
                True,
                f"GPU memory {share:.0%} used, at or above the {threshold:.0%} threshold",
            )
            continue
        if usage.unplaced:
            out[name] = Guard(name, True, "holds GPU pods whose GPUs are not known")
            continue
        if not pools[_pool(nodes[name])].move_away(name, usage.allocations):
            out[name] = Guard(
                name,
                True,
                f"its {len(usage.allocations)} GPU pod(s) would not all fit, GPU by GPU, on "
                f"the other nodes of its pool",
            )
            continue
        out[name] = Guard(name, False, "")
    return out


def dra_guards(
    dra: DraLedger,
    node_objects: Mapping[str, KubeObject] | None = None,
    *,
    threshold: float = THRESHOLD,
) -> dict[str, Guard]:
    """One ``Guard`` per DRA node with GPUs in its slice, from the allocated claims; the Node
    objects, when given, add the placement label and host resources."""
    objects = node_objects or {}
    nodes = {name: dra.inventory(name, objects.get(name)) for name in dra.nodes}
    return guards(nodes, dra, threshold=threshold)


class _Room:
    """The free room of one pool's GPUs, kept sorted by free memory for best fit."""

    def __init__(self) -> None:
        self.slots: list[tuple[int, str, int]] = []
        """(free memory units, node, GPU index), sorted."""
        self.core: dict[tuple[str, int], int] = {}
        self.free: dict[tuple[str, int], int] = {}
        """Each GPU's free memory units now (its slot's first field)."""
        self.gpus: dict[str, list[int]] = {}
        """Each node's GPU indexes in this room."""
        self._away = ""
        """The node whose pods are being moved (its room is not theirs)."""

    def add(self, node: str, index: int, mem: int, core: int) -> None:
        insort(self.slots, (mem, node, index))
        self.core[(node, index)] = core
        self.free[(node, index)] = mem
        self.gpus.setdefault(node, []).append(index)

    def _take(self, slot: tuple[int, str, int], mem: int, core: int) -> None:
        del self.slots[bisect_left(self.slots, slot)]
        _, node, index = slot
        insort(self.slots, (slot[0] - mem, node, index))
        self.core[(node, index)] -= core
        self.free[(node, index)] = slot[0] - mem

    def move_away(self, name: str, allocations: Sequence[Allocation]) -> bool:
        """Place the node's pods on the others' room; keep that (and drop the node's own
        room) when every pod fits, else leave the room as it was."""
        own = [(self.free[(name, i)], name, i) for i in self.gpus.get(name, ())]
        self._away = name
        for slot in own:
            del self.slots[bisect_left(self.slots, slot)]
        done: list[tuple[tuple[int, str, int], int, int]] = []
        for allocation in sorted(allocations, key=lambda a: -a.mem_units):
            placed = self._place(allocation)
            if placed is None:
                for slot, mem, core in reversed(done):  # give it all back
                    taken = (slot[0] - mem, slot[1], slot[2])
                    del self.slots[bisect_left(self.slots, taken)]
                    insort(self.slots, slot)
                    self.core[(slot[1], slot[2])] += core
                    self.free[(slot[1], slot[2])] = slot[0]
                for slot in own:
                    insort(self.slots, slot)
                return False
            done += placed
        for slot in own:
            self.core.pop((slot[1], slot[2]), None)
            self.free.pop((slot[1], slot[2]), None)
        self.gpus.pop(name, None)
        return True

    def _place(self, allocation: Allocation) -> list[tuple[tuple[int, str, int], int, int]] | None:
        shares = sorted(allocation.gpus, key=lambda s: -s.mem_units)
        if len(shares) == 1:  # best fit: the smallest room that holds it
            share = shares[0]
            slots, cores = self.slots, self.core
            for at in range(bisect_left(slots, (share.mem_units, "", -1)), len(slots)):
                slot = slots[at]
                if cores[(slot[1], slot[2])] >= share.core_pct:
                    self._take(slot, share.mem_units, share.core_pct)
                    return [(slot, share.mem_units, share.core_pct)]
            return None
        by_node = {
            node: [(self.free[(node, i)], node, i) for i in indexes]
            for node, indexes in self.gpus.items()
            if node != self._away
        }
        for slots in by_node.values():  # a pod over several GPUs: one node holding them all
            chosen: list[tuple[tuple[int, str, int], int, int]] = []
            free = list(slots)
            for share in shares:
                fit = next(
                    (
                        s
                        for s in free
                        if s[0] >= share.mem_units and self.core[(s[1], s[2])] >= share.core_pct
                    ),
                    None,
                )
                if fit is None:
                    break
                free.remove(fit)
                chosen.append((fit, share.mem_units, share.core_pct))
            if len(chosen) == len(shares):
                for slot, mem, core in chosen:
                    self._take(slot, mem, core)
                return chosen
        return None
