"""The ledger: who holds how much memory and computing power on which GPU.

Three kinds of entry, keyed by pod UID:

- confirmed: read from a pod's annotations as the API server returned it;
- assumed: reserved by bind before the annotations are seen back through the watch (the
  kube-scheduler "assume" idea). An assumption outlives stale watch events of the same pod and is
  dropped only when the pod is seen with the same placement, finishes, is deleted, or bind gives
  it back; this closes the window in which a lagging watch could hide a fresh booking;
- intended: booked when the extender's prioritize answered with one node on top, before
  kube-scheduler has chosen (``intend``): the GPUs its top score promises. kube-scheduler
  filters the next pod while the previous bind is still on its way, and without the intent
  that pod is sent to the same free share, and its bind finds it taken. An intent is an
  assumption with a deadline: bind's own booking (``assume``) replaces it, on that node or
  another; it is given back when the deadline passes (``expire``), when the pod is seen bound
  or is gone, or when it is replaced by the pod's next attempt;
- unplaced: a pod bound to a node that asks for GPU memory but carries no allocation that counts
  (placed by another scheduler, an unreadable record, or one core.records.trust ignores). Its GPU is
  unknown, so it counts against the node as a whole; ``kubectl inspect cgpu`` shows it in the
  PENDING column.

Every allocation read from annotations is judged first (``Trust``, core.records.trust): only records
gpushare sealed for this very pod count, so a tenant's forged record fills no GPU. The judgement
runs once per pod version the watch delivers, never per filter call. Assumptions are the
extender's own bookings and are not judged. The default ``Trust`` has no key and ignores every
record: a ledger that should read annotations is given the key (or, knowingly, structure only).

Succeeded and Failed pods free their share; terminating pods keep it until they are gone,
because their containers may still be running on the GPU.

The ledger also sums the CPU and host memory that every live pod bound to a node requests, GPU
or not, plus the pods assumed at bind until the watch shows them bound (``NodeUsage.host``):
the fragmentation-aware policy counts GPU share that no CPU is left to use. A change of those
sums changes the node's version like any booking, so cached scores follow it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gpushare.core.booking.changes import ChangeLog
from gpushare.core.model.hostresources import NOTHING as NO_HOST
from gpushare.core.model.hostresources import HostResources, pod_requests
from gpushare.core.model.kubejson import (
    TERMINAL_PHASES,
    KubeObject,
    name_of,
    namespace_of,
    node_name_of,
    pod_status_of,
    uid_of,
)
from gpushare.core.model.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, from_pod
from gpushare.core.records.trust import Ignored, Judged, Trust


@dataclass(frozen=True)
class Unplaced:
    """GPU memory held on a node by a pod whose GPU is unknown."""

    uid: str
    namespace: str
    name: str
    node: str
    mem_units: int


@dataclass(frozen=True)
class IgnoredAllocation:
    """A pod whose allocation annotation does not count, and why."""

    uid: str
    namespace: str
    name: str
    node: str
    """The node the ignored record names."""
    why: Ignored


@dataclass(frozen=True)
class Kept:
    """A bind-time booking a pod held before the next bind booked over it: kept from a bind
    whose outcome was unknown, so it must come back if the next bind writes nothing."""

    allocation: Allocation
    host: HostResources


@dataclass(frozen=True)
class GpuUsage:
    """What is held on one GPU."""

    mem_units: int = 0
    core_pct: int = 0
    pods: int = 0


NOTHING = GpuUsage()


@dataclass(frozen=True)
class NodeUsage:
    """What is held on one node, GPU by GPU."""

    gpus: Mapping[int, GpuUsage] = field(default_factory=dict)
    allocations: tuple[Allocation, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    host: HostResources = NO_HOST
    """CPU and host memory requested by every live pod bound or assumed on the node."""

    def on(self, index: int) -> GpuUsage:
        """Usage of one GPU (zero when nothing is held there)."""
        return self.gpus.get(index, NOTHING)

    @property
    def unplaced_mem_units(self) -> int:
        """Memory held on an unknown GPU of this node."""
        return sum(entry.mem_units for entry in self.unplaced)

    @property
    def mem_units(self) -> int:
        """All memory held on the node."""
        return sum(u.mem_units for u in self.gpus.values()) + self.unplaced_mem_units

    @cached_property
    def signature(self) -> tuple[int, ...]:
        """What the filter and the scores read from this usage, as plain numbers.

        Equal signatures on nodes of one ``kind`` decide alike, unless the node's hand-off
        has pending allocations (their containers are compared too; see ``Scheduler``).
        """
        out = [self.mem_units, self.unplaced_mem_units, self.host.cpu_milli, self.host.memory_bytes]
        for index, held in sorted(self.gpus.items()):
            out += (index, held.mem_units, held.core_pct, held.pods)
        return tuple(out)


EMPTY_NODE = NodeUsage()
_NONE: frozenset[str] = frozenset()


def is_terminal(pod: KubeObject) -> bool:
    """Whether the pod has finished and holds nothing any more."""
    return str(pod_status_of(pod).get("phase") or "") in TERMINAL_PHASES


class Ledger:
    """Holdings per pod and per node; pure bookkeeping, no I/O."""

    def __init__(
        self,
        *,
        names: ResourceNames = DEFAULT_NAMES,
        unit: MemoryUnit = MemoryUnit.GiB,
        trust: Trust | None = None,
        judged: Judged | None = None,
    ) -> None:
        self._names = names
        self._unit = unit
        if judged is None:
            judged = Judged(trust if trust is not None else Trust(), names)
        elif trust is not None and judged.trust != trust:
            raise ValueError("a ledger judges with one Trust: give trust or judged, not both")
        self.judged = judged
        """Judges every allocation read from annotations (the default Trust: none counts);
        a rebuilt ledger may take over the previous one's, to verify nothing twice."""
        self._ignored: dict[str, IgnoredAllocation] = {}
        self._confirmed: dict[str, Allocation] = {}
        self._assumed: dict[str, Allocation] = {}
        self._unplaced: dict[str, Unplaced] = {}
        self._claimed: dict[str, Allocation] = {}
        """Allocations of DRA claims, by claim UID (``claim``)."""
        self._intents: dict[str, int] = {}
        """Assumptions that are intents: pod UID to the deadline (ns) of its intent."""
        self._booked: dict[str, int] = {}
        """When each intent was booked (ns), where its booker said (``intent_booked``)."""
        self._deadlines: list[tuple[int, str]] = []
        """Intent deadlines as a heap; entries an intent no longer has are skipped."""
        self._by_node: dict[str, set[str]] = {}
        self._nodes_of: dict[str, set[str]] = {}
        self._node_versions: dict[str, int] = {}
        self._host: dict[str, tuple[str, HostResources, bool]] = {}
        """Per pod: (node, its CPU and memory requests, whether only assumed at bind)."""
        self._host_by_node: dict[str, HostResources] = {}
        self._pods_by_node: dict[str, int] = {}
        """Live pods counted on each node (bound, or assumed at bind): NodeResourcesFit's pod
        count, which DRA mode's allocator checks before it pins a claim to a node."""
        self.epoch = 0
        """Counts changes; equal epochs mean equal holdings (for reusing filter verdicts)."""
        self._usage: dict[str, NodeUsage] = {}
        """Per-node usage, computed on demand and dropped whenever the node's holdings change."""
        self.changes = ChangeLog()
        """Nodes whose holdings changed, in order (for memos that must not scan every node)."""

    @classmethod
    def from_pods(
        cls,
        pods: Iterable[KubeObject],
        *,
        names: ResourceNames = DEFAULT_NAMES,
        unit: MemoryUnit = MemoryUnit.GiB,
        trust: Trust | None = None,
    ) -> Ledger:
        """Rebuild a ledger from pods alone, as after a restart."""
        ledger = cls(names=names, unit=unit, trust=trust)
        for pod in pods:
            ledger.observe(pod)
        return ledger

    # -- changes ---------------------------------------------------------------------------

    def observe(self, pod: KubeObject) -> Ignored | None:
        """Take in a pod as the API server shows it (added or modified).

        Returns why its allocation annotation was ignored, if it was.
        """
        uid = uid_of(pod)
        if is_terminal(pod):
            self.forget(uid)
            return None
        bound = node_name_of(pod)
        if bound and uid in self._intents:  # bound: whatever bound it booked for itself
            del self._intents[uid]
            self._assumed.pop(uid, None)
        if bound:
            self._set_host(uid, bound, pod_requests(pod), assumed=False)
        allocation = from_pod(pod)
        ignored: Ignored | None = None
        if allocation is not None:
            judgement = self.judged.judge(pod, allocation)
            if isinstance(judgement, Ignored):
                ignored = judgement
                self._ignored[uid] = IgnoredAllocation(
                    uid, allocation.namespace, allocation.name, allocation.node, judgement
                )
                allocation = None
        if ignored is None:
            self._ignored.pop(uid, None)
        if allocation is not None:
            self._confirmed[uid] = allocation
            self._unplaced.pop(uid, None)
            assumed = self._assumed.get(uid)
            if assumed is not None and assumed.same_placement(allocation):
                del self._assumed[uid]
                self._intents.pop(uid, None)
        else:
            self._confirmed.pop(uid, None)
            node = bound
            request = read_pod(pod, names=self._names, unit=self._unit) if node else None
            if node and isinstance(request, PodRequest) and request.wants_gpu:
                self._unplaced[uid] = Unplaced(
                    uid=uid,
                    namespace=namespace_of(pod),
                    name=name_of(pod),
                    node=node,
                    mem_units=request.mem_units,
                )
            else:
                self._unplaced.pop(uid, None)
        self._reindex(uid)
        return ignored

    def forget(self, uid: str) -> None:
        """Drop everything a pod held (deleted, Succeeded or Failed)."""
        self.judged.forget(uid)
        self._ignored.pop(uid, None)
        self._confirmed.pop(uid, None)
        self._assumed.pop(uid, None)
        self._intents.pop(uid, None)
        self._unplaced.pop(uid, None)
        self._drop_host(uid)
        self._reindex(uid)

    def claim(self, allocation: Allocation) -> None:
        """Hold what an allocated DRA claim holds (``core.dra.ledger.ClaimHolding``), keyed by
        the claim's UID; a claim seen again replaces its earlier holding. The pods that use the
        claim count their CPU and memory through ``observe`` as any pod does."""
        self._claimed[allocation.uid] = allocation
        self._reindex(allocation.uid)

    def unclaim(self, uid: str) -> None:
        """Drop a claim's holding (deallocated or deleted); idempotent."""
        if self._claimed.pop(uid, None) is not None:
            self._reindex(uid)

    def claims(self) -> Iterator[Allocation]:
        """Every DRA claim's holding, in claim UID order."""
        for uid in sorted(self._claimed):
            yield self._claimed[uid]

    def assume(self, allocation: Allocation, host: HostResources = NO_HOST) -> None:
        """Reserve at bind time, before the annotations are seen back.

        ``host`` is the pod's CPU and memory request; it counts on the node until the watch
        shows the pod bound there (or it is given back), unless the pod is already seen bound.
        It replaces the pod's intent, if it had one.
        """
        self._intents.pop(allocation.uid, None)
        self._booked.pop(allocation.uid, None)
        self._assumed[allocation.uid] = allocation
        known = self._host.get(allocation.uid)
        if known is None or known[2]:
            self._set_host(allocation.uid, allocation.node, host, assumed=True)
        self._reindex(allocation.uid)

    def intend(
        self,
        allocation: Allocation,
        host: HostResources,
        *,
        until_ns: int,
        booked_ns: int | None = None,
    ) -> None:
        """Book what the extender's top score promises a pod, until ``until_ns`` at most.

        Counted like an assumption (every decision sees it) and replaced by one at bind. A
        pod holds one intent: a later one replaces it, wherever it was. ``booked_ns`` is when
        it was booked, which decides when it gives way to other pods (``core.decision.verbs``).
        """
        self.assume(allocation, host)
        self._intents[allocation.uid] = until_ns
        if booked_ns is None:
            self._booked.pop(allocation.uid, None)
        else:
            self._booked[allocation.uid] = booked_ns
        heapq.heappush(self._deadlines, (until_ns, allocation.uid))

    def extend(self, uid: str, until_ns: int) -> None:
        """Move the deadline of the pod's intent to ``until_ns``; nothing when it holds none."""
        if uid in self._intents:
            self._intents[uid] = until_ns
            heapq.heappush(self._deadlines, (until_ns, uid))

    def expire(self, now_ns: int) -> list[str]:
        """Give back every intent whose deadline has passed; return their pods' UIDs."""
        expired = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ns:
            deadline, uid = heapq.heappop(deadlines)
            if self._intents.get(uid) == deadline:
                self.unassume(uid)
                expired.append(uid)
        return expired

    def kept(self, uid: str) -> Kept | None:
        """The pod's bind-time booking, if it holds one that is not an intent."""
        allocation = self._assumed.get(uid)
        if allocation is None or uid in self._intents:
            return None
        return Kept(allocation, self.host_of(uid))

    def intent_until(self, uid: str) -> int | None:
        """The deadline of the pod's intent (ns), or None when it holds no intent."""
        return self._intents.get(uid)

    def intent_booked(self, uid: str) -> int | None:
        """When the pod's intent was booked (ns); None when it holds none or nobody said."""
        return self._booked.get(uid) if uid in self._intents else None

    def unassume(self, uid: str) -> None:
        """Give back a reservation whose bind failed, or an intent; idempotent."""
        self._intents.pop(uid, None)
        self._booked.pop(uid, None)
        self._assumed.pop(uid, None)
        known = self._host.get(uid)
        if known is not None and known[2]:
            self._drop_host(uid)
        self._reindex(uid)

    def _set_host(self, uid: str, node: str, host: HostResources, *, assumed: bool) -> None:
        known = self._host.get(uid)
        if known is not None and known[0] == node and known[1] == host:
            if known[2] != assumed:
                self._host[uid] = (node, host, assumed)
            return
        self._drop_host(uid)
        self._host[uid] = (node, host, assumed)
        self._host_by_node[node] = self._host_by_node.get(node, NO_HOST) + host
        self._pods_by_node[node] = self._pods_by_node.get(node, 0) + 1
        self._touch(node)

    def _drop_host(self, uid: str) -> None:
        known = self._host.pop(uid, None)
        if known is None:
            return
        node, host, _ = known
        count = self._pods_by_node.get(node, 0) - 1
        if count > 0:
            self._pods_by_node[node] = count
        else:
            self._pods_by_node.pop(node, None)
        left = self._host_by_node.get(node, NO_HOST) - host
        if left == NO_HOST:
            self._host_by_node.pop(node, None)
        else:
            self._host_by_node[node] = left
        self._touch(node)

    def _touch(self, node: str) -> None:
        """The node's usage changed: a new epoch, marked on the node."""
        self.epoch += 1
        self._mark(node)

    def _mark(self, node: str) -> None:
        """The node changed in this epoch: its version, cached usage dropped, change logged."""
        self._usage.pop(node, None)
        self._node_versions[node] = self.epoch
        self.changes.add(node)

    def _reindex(self, uid: str) -> None:
        self.epoch += 1
        for node in self._nodes_of.get(uid, ()):
            self._mark(node)
        for node in self._nodes_of.pop(uid, set()):
            members = self._by_node.get(node)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._by_node[node]
        nodes = set()
        holding = self.holding(uid)
        if holding is not None:
            nodes.add(holding.node)
        if uid in self._unplaced:
            nodes.add(self._unplaced[uid].node)
        if nodes:
            self._nodes_of[uid] = nodes
            for node in nodes:
                self._by_node.setdefault(node, set()).add(uid)
                self._mark(node)

    # -- queries ---------------------------------------------------------------------------

    def holding(self, uid: str) -> Allocation | None:
        """The pod's effective allocation: its assumption if any, else what was observed; for
        a claim's UID, the claim's holding."""
        return self._assumed.get(uid) or self._confirmed.get(uid) or self._claimed.get(uid)

    def assumptions(self) -> Iterator[Allocation]:
        """Bind-time reservations not yet seen back, in UID order."""
        for uid in sorted(self._assumed):
            yield self._assumed[uid]

    def pods_on(self, node: str) -> int:
        """Live pods counted on the node (those whose CPU and memory count there)."""
        return self._pods_by_node.get(node, 0)

    def host_of(self, uid: str) -> HostResources:
        """The CPU and memory the pod's requests count on its node (nothing if not counted)."""
        known = self._host.get(uid)
        return known[1] if known is not None else NO_HOST

    def is_assumed(self, uid: str) -> bool:
        """Whether the pod's holding is a bind-time reservation not yet seen back (or an
        intent)."""
        return uid in self._assumed

    def intents(self) -> Iterator[tuple[Allocation, int]]:
        """Every intent with its deadline (ns), in UID order."""
        for uid in sorted(self._intents):
            yield self._assumed[uid], self._intents[uid]

    def allocations(self) -> Iterator[Allocation]:
        """Every effective allocation (DRA claims' included), in UID order."""
        for uid in sorted(set(self._confirmed) | set(self._assumed) | set(self._claimed)):
            holding = self.holding(uid)
            if holding is not None:
                yield holding

    def ignored(self) -> Iterator[IgnoredAllocation]:
        """Live pods whose allocation annotation does not count, in UID order."""
        for uid in sorted(self._ignored):
            yield self._ignored[uid]

    def nodes(self) -> set[str]:
        """Nodes where any GPU share is held."""
        return set(self._by_node)

    def node_version(self, node: str) -> int:
        """Changes whenever the node's holdings change (0 for a node never touched)."""
        return self._node_versions.get(node, 0)

    @property
    def node_versions(self) -> Mapping[str, int]:
        """``node_version`` of every node ever touched, for look-ups in a tight loop."""
        return self._node_versions

    def nodes_held_by(self, uid: str) -> frozenset[str] | set[str]:
        """Nodes where the pod holds anything (do not modify)."""
        return self._nodes_of.get(uid, _NONE)

    def holds_on(self, uid: str, node: str) -> bool:
        """Whether the pod holds anything on the node."""
        return uid in self._by_node.get(node, ())

    def usage(self, node: str, *, excluding: str = "") -> NodeUsage:
        """What is held on a node; ``excluding`` leaves one pod out (for re-binding it)."""
        members = self._by_node.get(node)
        if not members and node not in self._host_by_node:
            return EMPTY_NODE
        if excluding and (
            (members and excluding in members) or self._host.get(excluding, ("",))[0] == node
        ):
            return self._compute_usage(node, excluding)
        cached = self._usage.get(node)
        if cached is None:
            cached = self._usage[node] = self._compute_usage(node, "")
        return cached

    def _compute_usage(self, node: str, excluding: str) -> NodeUsage:
        mem: dict[int, int] = {}
        core: dict[int, int] = {}
        pods: dict[int, int] = {}
        allocations = []
        unplaced = []
        for uid in sorted(self._by_node.get(node, ())):
            if uid == excluding:
                continue
            holding = self.holding(uid)
            if holding is not None and holding.node == node:
                allocations.append(holding)
                for share in holding.gpus:
                    mem[share.index] = mem.get(share.index, 0) + share.mem_units
                    core[share.index] = core.get(share.index, 0) + share.core_pct
                    pods[share.index] = pods.get(share.index, 0) + 1
            entry = self._unplaced.get(uid)
            if entry is not None and entry.node == node:
                unplaced.append(entry)
        gpus = {i: GpuUsage(mem_units=mem[i], core_pct=core[i], pods=pods[i]) for i in mem}
        host = self._host_by_node.get(node, NO_HOST)
        left_out = self._host.get(excluding) if excluding else None
        if left_out is not None and left_out[0] == node:
            host = host - left_out[1]
        return NodeUsage(
            gpus=gpus, allocations=tuple(allocations), unplaced=tuple(unplaced), host=host
        )

    def state(self) -> dict[str, tuple[object, ...]]:
        """A comparable summary of every node's holdings (for tests and invariants)."""
        out: dict[str, tuple[object, ...]] = {}
        for node in sorted(self._by_node):
            usage = self.usage(node)
            out[node] = (
                tuple(sorted(usage.gpus.items())),
                usage.unplaced_mem_units,
                tuple(sorted((a.uid, a.gpus) for a in usage.allocations)),
            )
        return out
