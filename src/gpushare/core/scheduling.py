"""The scheduler's extension points over an explicit snapshot: filter, score, reserve.

``Scheduler`` holds only settings; every call gets the node inventories and the ledger it
should decide on. The extender, the demo and the simulator all drive this one class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpushare.core.allocation import Allocation, plan
from gpushare.core.defragmenting import WorkloadFeed, all_policies
from gpushare.core.filtering import Code, GpuChooser, Rules, Verdict, filter_node
from gpushare.core.handoff import conflict, pending_of, preferred_gpus
from gpushare.core.inventory import NodeInventory
from gpushare.core.kubejson import KubeObject
from gpushare.core.ledger import Ledger, NodeUsage
from gpushare.core.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.placing import Candidate
from gpushare.core.requests import PodRequest, Rejection, read_pod
from gpushare.core.scoring import ChoosingPolicy, NodePolicy, PolicyRegistry
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
    request: PodRequest,
    node: NodeInventory,
    usage: NodeUsage,
    rules: Rules,
    chooser: GpuChooser | None = None,
) -> Verdict:
    """Filter, then keep the hand-off invariant on nodes whose device plugin relies on it."""
    verdict = filter_node(request, node, usage, rules=rules, chooser=chooser)
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


Decision = tuple[NodeInventory, int, tuple[Verdict, float]]
"""(node, ledger node version, (verdict, score)) as remembered."""


class VerdictMemo:
    """Remembers verdicts and scores per node and request shape while nothing they use changes.

    A verdict depends only on the node's inventory, what is held there and the request's shape
    (per-GPU memory and core, GPU count, containers), not on which pod asks; the score also on
    the policy's state. Pods come in few shapes and a bind changes one node, so on a large
    cluster most filter and prioritize calls become one dictionary look-up per node. Entries
    are grouped by shape (one table per shape, dropped when the ledger object or the policy's
    version changes), so a look-up builds no key per node.
    """

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        """Shapes remembered before starting over."""
        self._state: tuple[Ledger | None, int] = (None, 0)
        self._tables: dict[tuple[object, ...], dict[str, Decision]] = {}

    def table(self, request: PodRequest, ledger: Ledger, version: int = 0) -> dict[str, Decision]:
        """The node-name -> decision table for the request's shape on this ledger."""
        state = self._state
        if state[0] is not ledger or state[1] != version or len(self._tables) >= self._limit:
            self._tables.clear()
            self._state = (ledger, version)
        key = (
            request.mem_per_gpu,
            request.core_per_gpu,
            request.gpu_count,
            request.mem_units,
            tuple((c.kind, c.mem_units, c.core_pct) for c in request.containers),
        )
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        return table


@dataclass
class Scheduler:
    """Filter, score and reserve for shared-GPU pods.

    With a ``ChoosingPolicy`` (``fgd``, ``gpushare``) the policy also picks the GPU inside each
    node, so the filter's verdict, the score and the booking at bind all use its choice.
    """

    settings: Settings = field(default_factory=Settings)
    workload: WorkloadFeed | None = None
    """The target workload the fragmentation-aware policies learn; the cache feeds it."""
    registry: PolicyRegistry | None = None
    memo: VerdictMemo = field(default_factory=VerdictMemo)

    def __post_init__(self) -> None:
        if self.workload is None:
            self.workload = WorkloadFeed(names=self.settings.names, unit=self.settings.unit)
        if self.registry is None:
            self.registry = all_policies(self.workload)
        self.policy: NodePolicy = self.registry.get(self.settings.policy)  # fails early
        self._choosing = self.policy if isinstance(self.policy, ChoosingPolicy) else None
        self._rules = self.settings.rules

    def read(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod's request under these settings."""
        return read_pod(pod, names=self.settings.names, unit=self.settings.unit)

    def _decide(self, request: PodRequest, node: NodeInventory, usage: NodeUsage) -> Verdict:
        """The filter's verdict, with the policy's GPU choice where it makes one."""
        policy = self._choosing
        chooser: GpuChooser | None = None
        if policy is not None:

            def chooser(fitting: Sequence[Candidate]) -> tuple[int, ...]:
                return policy.choose(request, node, usage, fitting)

        return _with_handoff(request, node, usage, self._rules, chooser)

    def _score(
        self, request: PodRequest, node: NodeInventory, usage: NodeUsage, v: Verdict
    ) -> float:
        if not v.fits:
            return 0.0
        return max(0.0, min(1.0, self.policy.score(request, node, usage, v.gpus)))

    def decisions(
        self, request: PodRequest, nodes: Sequence[NodeInventory], ledger: Ledger
    ) -> list[tuple[Verdict, float]]:
        """Verdict and score (0..1, 0 when it does not fit) per node, remembered per shape.

        The pod's own earlier holding is left out of the count (re-binding it).
        """
        version = self._choosing.version if self._choosing is not None else 0
        table = self.memo.table(request, ledger, version)
        get = table.get
        current = ledger.node_versions.get
        held = ledger.nodes_held_by(request.uid)
        out: list[tuple[Verdict, float]] = []
        append = out.append
        for node in nodes:
            name = node.name
            hit = get(name)
            if hit is not None and hit[0] is node and hit[1] == current(name, 0):
                if name not in held:
                    append(hit[2])
                    continue
            if name in held:  # re-binding: its own share is left out, nothing remembered
                usage = ledger.usage(name, excluding=request.uid)
                verdict = self._decide(request, node, usage)
                append((verdict, self._score(request, node, usage, verdict)))
                continue
            usage = ledger.usage(name)
            verdict = self._decide(request, node, usage)
            pair = (verdict, self._score(request, node, usage, verdict))
            table[name] = (node, current(name, 0), pair)
            append(pair)
        return out

    def verdict(self, request: PodRequest, node: NodeInventory, ledger: Ledger) -> Verdict:
        """Filter one node, leaving the pod's own earlier holding out of the count."""
        return self.decisions(request, [node], ledger)[0][0]

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
            request=request, verdicts=tuple(v for v, _ in self.decisions(request, nodes, ledger))
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
        if not request.wants_gpu or (verdict is not None and not verdict.fits):
            return 0.0
        return self.decisions(request, [node], ledger)[0][1]

    def prioritize(
        self,
        pod: KubeObject,
        nodes: Iterable[NodeInventory],
        ledger: Ledger,
        *,
        request: PodRequest | Rejection | None = None,
    ) -> dict[str, int]:
        """Extender scores 0..10 per node.

        A ``ChoosingPolicy``'s scores are normalised over the nodes given: the best fitting node
        gets 10, the worst 0, linearly between (floored, so only the best get 10); otherwise
        sigmoid values of nearby growths would all round to the same integer.
        ``request`` may pass the pod's request when the caller has already read it.
        """
        if request is None:
            request = self.read(pod)
        nodes = list(nodes)
        if isinstance(request, Rejection) or not request.wants_gpu:
            return {n.name: 0 for n in nodes}
        decided = self.decisions(request, nodes, ledger)
        if self._choosing is None or not self._choosing.active:
            return {n.name: round(s * MAX_SCORE) for n, (_, s) in zip(nodes, decided, strict=True)}
        fitting = [s for v, s in decided if v.fits]
        if not fitting:
            return {n.name: 0 for n in nodes}
        low, high = min(fitting), max(fitting)
        span = high - low
        out: dict[str, int] = {}
        for node, (verdict, value) in zip(nodes, decided, strict=True):
            if not verdict.fits:
                out[node.name] = 0
            elif span <= 0 or value >= high:
                out[node.name] = MAX_SCORE
            else:
                out[node.name] = min(MAX_SCORE - 1, int((value - low) / span * MAX_SCORE))
        return out

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
