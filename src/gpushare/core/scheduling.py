"""The scheduler's extension points over an explicit snapshot: filter, score, reserve.

``Scheduler`` holds only settings; every call gets the node inventories and the ledger it
should decide on. The extender, the demo and the simulator all drive this one class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpushare.core.allocation import Allocation, plan
from gpushare.core.filtering import Code, Rules, Verdict, filter_node
from gpushare.core.handoff import conflict, pending_of, preferred_gpus
from gpushare.core.inventory import NodeInventory
from gpushare.core.kubejson import KubeObject
from gpushare.core.ledger import Ledger, NodeUsage
from gpushare.core.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.requests import PodRequest, Rejection, read_pod
from gpushare.core.scoring import PolicyRegistry, default_policies
from gpushare.core.units import MemoryUnit

MAX_SCORE = 10
"""The kube-scheduler extender's maximum priority."""


@dataclass(frozen=True)
class Settings:
    """Cluster-wide scheduling settings, validated at the config edge."""

    unit: MemoryUnit = MemoryUnit.GiB
    max_pods_per_gpu: int | None = None
    policy: str = "binpack"
    names: ResourceNames = DEFAULT_NAMES

    @property
    def rules(self) -> Rules:
        """The filter's view of these settings."""
        return Rules(cluster_unit=self.unit, max_pods_per_gpu=self.max_pods_per_gpu)


@dataclass(frozen=True)
class FilterResult:
    """A pod's verdict on every node asked about."""

    request: PodRequest | Rejection
    verdicts: tuple[Verdict, ...] = ()

    @property
    def passing(self) -> list[str]:
        """Names of the nodes that fit."""
        return [v.node for v in self.verdicts if v.fits]


def _with_handoff(
    request: PodRequest, node: NodeInventory, usage: NodeUsage, rules: Rules
) -> Verdict:
    """Filter, then keep the hand-off invariant on nodes whose device plugin relies on it."""
    verdict = filter_node(request, node, usage, rules=rules)
    if not (verdict.fits and node.handoff):
        return verdict
    pending = pending_of(usage.allocations)
    if not pending:
        return verdict
    reason = conflict(plan(request, node=node.name, indexes=verdict.gpus, unit=node.unit), pending)
    if not reason:
        return verdict
    prefer = preferred_gpus((c.mem_units for c in request.containers), pending)
    if prefer:
        again = filter_node(request, node, usage, rules=rules, prefer=prefer)
        if again.fits and not conflict(
            plan(request, node=node.name, indexes=again.gpus, unit=node.unit), pending
        ):
            return again
    return Verdict(node=node.name, code=Code.UNSCHEDULABLE, reasons=(reason,))


class VerdictMemo:
    """Remembers verdicts per node and request shape while the node's holdings stay the same.

    A verdict depends only on the node's inventory, what is held there and the request's shape
    (per-GPU memory and core, GPU count), not on which pod asks. Pods come in few shapes, and a
    bind changes one node, so most filter calls on a large cluster become dictionary look-ups.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self._limit = limit
        self._items: dict[tuple[object, ...], tuple[NodeInventory, Ledger, Verdict]] = {}

    def verdict(
        self, request: PodRequest, node: NodeInventory, ledger: Ledger, rules: Rules
    ) -> Verdict:
        """The cached verdict, or a fresh one (which is then remembered)."""
        if ledger.holds_on(request.uid, node.name):  # re-binding: its own share is left out
            usage = ledger.usage(node.name, excluding=request.uid)
            return _with_handoff(request, node, usage, rules)
        key = (
            node.name,
            id(node),
            id(ledger),
            ledger.node_version(node.name),
            request.mem_per_gpu,
            request.core_per_gpu,
            request.gpu_count,
            request.mem_units,
            tuple((c.kind, c.mem_units, c.core_pct) for c in request.containers),
        )
        hit = self._items.get(key)
        if hit is not None and hit[0] is node and hit[1] is ledger:
            return hit[2]
        verdict = _with_handoff(request, node, ledger.usage(node.name), rules)
        if len(self._items) >= self._limit:
            self._items.clear()
        self._items[key] = (node, ledger, verdict)
        return verdict


@dataclass
class Scheduler:
    """Filter, score and reserve for shared-GPU pods."""

    settings: Settings = field(default_factory=Settings)
    registry: PolicyRegistry = field(default_factory=default_policies)
    memo: VerdictMemo = field(default_factory=VerdictMemo)

    def __post_init__(self) -> None:
        self.registry.get(self.settings.policy)  # fail at construction on an unknown policy
        self._rules = self.settings.rules

    def read(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod's request under these settings."""
        return read_pod(pod, names=self.settings.names, unit=self.settings.unit)

    def verdict(self, request: PodRequest, node: NodeInventory, ledger: Ledger) -> Verdict:
        """Filter one node, leaving the pod's own earlier holding out of the count."""
        return self.memo.verdict(request, node, ledger, self._rules)

    def filter(
        self, pod: KubeObject, nodes: Iterable[NodeInventory], ledger: Ledger
    ) -> FilterResult:
        """Verdicts for every node; an invalid pod fails everywhere with its reasons."""
        request = self.read(pod)
        nodes = list(nodes)
        if isinstance(request, Rejection):
            verdicts = tuple(
                Verdict(node=n.name, code=Code.UNRESOLVABLE, reasons=request.reasons) for n in nodes
            )
            return FilterResult(request=request, verdicts=verdicts)
        if not request.wants_gpu:
            return FilterResult(
                request=request,
                verdicts=tuple(Verdict(node=n.name, code=Code.FITS) for n in nodes),
            )
        return FilterResult(
            request=request, verdicts=tuple(self.verdict(request, n, ledger) for n in nodes)
        )

    def score(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        verdict: Verdict | None = None,
    ) -> float:
        """The policy's liking in [0, 1]; 0 for nodes that do not fit.

        ``verdict`` may pass this node's filter verdict computed on the same ledger state.
        """
        if not request.wants_gpu:
            return 0.0
        if verdict is None:
            verdict = self.verdict(request, node, ledger)
        if not verdict.fits:
            return 0.0
        usage = ledger.usage(node.name, excluding=request.uid)
        policy = self.registry.get(self.settings.policy)
        return max(0.0, min(1.0, policy.score(request, node, usage, verdict.gpus)))

    def prioritize(
        self,
        pod: KubeObject,
        nodes: Iterable[NodeInventory],
        ledger: Ledger,
        *,
        verdicts: Mapping[str, Verdict] | None = None,
        request: PodRequest | Rejection | None = None,
    ) -> dict[str, int]:
        """Extender scores 0..10 per node, reusing filter verdicts of the same ledger state.

        ``request`` may pass the pod's request when the caller has already read it.
        """
        if request is None:
            request = self.read(pod)
        if isinstance(request, Rejection):
            return {n.name: 0 for n in nodes}
        known = verdicts or {}
        return {
            n.name: round(self.score(request, n, ledger, verdict=known.get(n.name)) * MAX_SCORE)
            for n in nodes
        }

    def reserve(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        now_ns: int = 0,
    ) -> Allocation | Verdict:
        """Choose GPUs and book them in the ledger; a failing verdict when it no longer fits.

        Check and booking happen with no I/O between them, so callers running on one event
        loop cannot double-book.
        """
        verdict = self.verdict(request, node, ledger)
        if not verdict.fits:
            return verdict
        allocation = plan(
            request, node=node.name, indexes=verdict.gpus, unit=node.unit, assume_time_ns=now_ns
        )
        ledger.assume(allocation)
        return allocation

    def unreserve(self, uid: str, ledger: Ledger) -> None:
        """Give back a reservation; idempotent."""
        ledger.unassume(uid)
