"""The scheduler's extension points over an explicit snapshot: filter, score, reserve.

``Scheduler`` holds settings, the node policy and memos; every call gets the node inventories
and the ledger it should decide on. The extender, the demo and the simulator all drive this one
class. Two ways in decide alike: node lists (``filter``, ``prioritize``; a per-node memo checked
node by node) and node names from the cache's ``NodeTable`` (``filter_names``,
``prioritize_names``; per-shape views that follow change logs, for kube-scheduler's
``nodeCacheCapable`` calls over thousands of names). A test keeps them in agreement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from gpushare.core.allocation import Allocation, plan
from gpushare.core.changes import NodeTable
from gpushare.core.deciding import Decider, Decision
from gpushare.core.defragmenting import WorkloadFeed, all_policies
from gpushare.core.filtering import Code, Rules, Verdict
from gpushare.core.inventory import NodeInventory
from gpushare.core.kubejson import KubeObject
from gpushare.core.ledger import Ledger
from gpushare.core.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.ranking import absolute, normalized, single_top
from gpushare.core.requests import PodRequest, Rejection, read_pod
from gpushare.core.scoring import NodePolicy, PolicyRegistry
from gpushare.core.units import MemoryUnit


@dataclass(frozen=True)
class Settings:
    """Cluster-wide scheduling settings, validated at the config edge."""

    unit: MemoryUnit = MemoryUnit.GiB
    max_pods_per_gpu: int | None = None
    policy: str = "gpushare"
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


Remembered = tuple[NodeInventory, int, Decision]
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
        self._tables: dict[tuple[object, ...], dict[str, Remembered]] = {}

    def table(
        self, key: tuple[object, ...], ledger: Ledger, version: int = 0
    ) -> dict[str, Remembered]:
        """The node-name -> decision table for a request shape (``Decider.key``)."""
        state = self._state
        if state[0] is not ledger or state[1] != version or len(self._tables) >= self._limit:
            self._tables.clear()
            self._state = (ledger, version)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        return table


@dataclass(frozen=True)
class NamesResult:
    """A filter over node names, as kube-scheduler gets it back with ``nodeCacheCapable``."""

    request: PodRequest | Rejection
    passing: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    missing: list[str]


class ShapeView:
    """Known nodes' verdicts and scores for one request shape, grouped by outcome.

    It follows the change logs of the node table and the ledger and decides a node only when
    asked about it and not decided since it last changed, so answering a filter or a
    prioritize over thousands of names costs a few set operations in C plus the nodes a bind
    changed, instead of a Python step per node.
    """

    def __init__(self, nodes: NodeTable, ledger: Ledger, version: int) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.version = version
        self.positions = (nodes.changes.position, ledger.changes.position)
        self.decided: set[str] = set()
        """Names whose outcome below is current."""
        self.fits: dict[str, float] = {}
        """Score in [0, 1] of every node that fits."""
        self.tens: dict[str, int] = {}
        """The same as 0..10 (absolute policies)."""
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self.alike: dict[tuple[object, ...], tuple[Verdict, float]] = {}
        """Decisions by (node kind, usage signature): look-alike nodes are decided once."""
        self.groups: dict[tuple[object, ...], set[str]] = {}
        """The current names decided through each ``alike`` key."""
        self.key_of: dict[str, tuple[object, ...]] = {}

    def catch_up(self) -> None:
        """Forget the decisions on nodes that changed since the last call."""
        node_log, ledger_log = self.nodes.changes, self.ledger.changes
        by_node = node_log.since(self.positions[0])
        by_ledger = ledger_log.since(self.positions[1])
        self.positions = (node_log.position, ledger_log.position)
        if by_node is None or by_ledger is None:
            self.decided.clear()
            self.fits.clear()
            self.tens.clear()
            self.failed.clear()
            self.unresolvable.clear()
            self.groups.clear()
            self.key_of.clear()
            return
        for name in {*by_node, *by_ledger}:
            self.decided.discard(name)
            key = self.key_of.pop(name, None)
            if key is not None:
                self.groups[key].discard(name)
            self.fits.pop(name, None)
            self.tens.pop(name, None)
            self.failed.pop(name, None)
            self.unresolvable.pop(name, None)

    def put(
        self,
        name: str,
        verdict: Verdict | None,
        score: float,
        key: tuple[object, ...] | None = None,
    ) -> None:
        """Record the decision on a node not decided yet (None: the node is gone).

        ``key``: the node's ``alike`` key, when its decision follows from it alone.
        """
        self.decided.add(name)
        if key is not None:
            self.key_of[name] = key
            group = self.groups.get(key)
            if group is None:
                self.groups[key] = {name}
            else:
                group.add(name)
        if verdict is None:
            return
        if verdict.fits:
            self.fits[name] = score
            self.tens[name] = absolute(score)
        elif verdict.code is Code.UNSCHEDULABLE:
            self.failed[name] = verdict.message
        else:
            self.unresolvable[name] = verdict.message

    def put_group(
        self, key: tuple[object, ...], names: set[str], verdict: Verdict, score: float
    ) -> None:
        """Record one decision for every name of an ``alike`` group (none decided yet)."""
        self.alike[key] = (verdict, score)
        self.groups[key] = names
        self.decided |= names
        self.key_of.update(dict.fromkeys(names, key))
        if verdict.fits:
            self.fits.update(dict.fromkeys(names, score))
            self.tens.update(dict.fromkeys(names, absolute(score)))
        elif verdict.code is Code.UNSCHEDULABLE:
            self.failed.update(dict.fromkeys(names, verdict.message))
        else:
            self.unresolvable.update(dict.fromkeys(names, verdict.message))


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
    view_limit: int = 256
    """Request shapes whose views are kept before starting over."""

    def __post_init__(self) -> None:
        self._views: dict[tuple[object, ...], ShapeView] = {}
        if self.workload is None:
            self.workload = WorkloadFeed(names=self.settings.names, unit=self.settings.unit)
        if self.registry is None:
            self.registry = all_policies(self.workload)
        self.policy: NodePolicy = self.registry.get(self.settings.policy)  # fails early
        self.decider = Decider(self.settings.rules, self.policy)

    def read(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod's request under these settings."""
        return read_pod(pod, names=self.settings.names, unit=self.settings.unit)

    def _asked(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod that is being scheduled, and count it in the target workload.

        Counting here, not only from the cache's watch, makes the decision independent of
        whether the watch event for the pod arrived before kube-scheduler's call (the feed
        counts each UID once, so the watch's later event changes nothing).
        """
        request = self.read(pod)
        if isinstance(request, PodRequest) and self.workload is not None:
            self.workload.count(request.uid, request)
        return request

    def decisions(
        self, request: PodRequest, nodes: Sequence[NodeInventory], ledger: Ledger
    ) -> list[tuple[Verdict, float]]:
        """Verdict and score (0..1, 0 when it does not fit) per node, remembered per shape.

        The pod's own earlier holding is left out of the count (re-binding it).
        """
        table = self.memo.table(self.decider.key(request), ledger, self.decider.version)
        get = table.get
        current = ledger.node_versions.get
        held = ledger.nodes_held_by(request.uid)
        out: list[tuple[Verdict, float]] = []
        append = out.append
        for node in nodes:
            name = node.name
            hit = get(name)
            fresh = hit is not None and hit[0] is node and hit[1] == current(name, 0)
            if fresh and name not in held and hit is not None:
                append(hit[2])
                continue
            if name in held:  # re-binding: its own share is left out, nothing remembered
                usage = ledger.usage(name, excluding=request.uid)
                append(self.decider.decide(request, node, usage))
                continue
            usage = ledger.usage(name)
            pair = self.decider.decide(request, node, usage)
            table[name] = (node, current(name, 0), pair)
            append(pair)
        return out

    def _view(
        self, request: PodRequest, nodes: NodeTable, ledger: Ledger, wanted: set[str]
    ) -> ShapeView:
        """The request shape's view, current for every name in ``wanted``."""
        version = self.decider.version
        key = self.decider.key(request)
        view = self._views.get(key)
        if view is None or view.nodes is not nodes or view.ledger is not ledger:
            if len(self._views) >= self.view_limit:
                self._views.clear()
            view = self._views[key] = ShapeView(nodes, ledger, version)
        elif view.version != version:
            view = self._views[key] = self._rescored(request, view, version)
        else:
            view.catch_up()
        if view.decided >= wanted:
            return view
        alike = view.alike
        for name in wanted - view.decided:
            node = nodes.get(name)
            if node is None:
                view.put(name, None, 0.0)
                continue
            usage = ledger.usage(name)
            if node.handoff and any(not a.assigned for a in usage.allocations):
                # the hand-off compares pending containers, which the signature leaves out
                view.put(name, *self.decider.decide(request, node, usage))
                continue
            key = (node.kind, usage.signature)
            pair = alike.get(key)
            if pair is None:
                pair = alike[key] = self.decider.decide(request, node, usage)
            view.put(name, *pair, key)
        return view

    def _rescored(self, request: PodRequest, old: ShapeView, version: int) -> ShapeView:
        """A view under the policy's new version, re-deciding each ``alike`` group once.

        After a workload refresh every score is stale, but nodes that looked alike still do:
        one node per group is decided again and its outcome given to the whole group, so a
        refresh costs one decision per kind of node and usage, not one per node.
        """
        old.catch_up()
        view = ShapeView(old.nodes, old.ledger, version)
        view.positions = old.positions
        for key, names in old.groups.items():
            if not names:
                continue
            name = next(iter(names))
            node = old.nodes[name]
            usage = old.ledger.usage(name)
            view.put_group(key, names, *self.decider.decide(request, node, usage))
        return view

    def _rebinding(
        self, request: PodRequest, names: Iterable[str], nodes: NodeTable, ledger: Ledger
    ) -> dict[str, tuple[Verdict, float]]:
        """Decisions on the nodes where the pod already holds something, its share left out."""
        out: dict[str, tuple[Verdict, float]] = {}
        held = ledger.nodes_held_by(request.uid)
        if not held:  # the usual case: no set of thousands of names to build
            return out
        for name in held & set(names):
            node = nodes.get(name)
            if node is not None:
                usage = ledger.usage(name, excluding=request.uid)
                out[name] = self.decider.decide(request, node, usage)
        return out

    def filter_names(
        self, pod: KubeObject, names: list[str], nodes: NodeTable, ledger: Ledger
    ) -> NamesResult:
        """``filter`` over node names from the cache's table, answered from the shape's view."""
        request = self._asked(pod)
        wanted = set(names)
        missing = [] if nodes.keys() >= wanted else [n for n in names if n not in nodes]
        if isinstance(request, Rejection):
            reason = request.message
            known = {n: reason for n in names if n in nodes}
            return NamesResult(request, [], {}, known, missing)
        if not request.wants_gpu:
            return NamesResult(request, [n for n in names if n in nodes], {}, {}, missing)
        view = self._view(request, nodes, ledger, wanted)
        passing = list(filter(view.fits.__contains__, names))
        failed = {n: view.failed[n] for n in view.failed.keys() & wanted}
        unresolvable = {n: view.unresolvable[n] for n in view.unresolvable.keys() & wanted}
        again = self._rebinding(request, wanted, nodes, ledger)
        if again:
            for name, (verdict, _) in again.items():
                failed.pop(name, None)
                unresolvable.pop(name, None)
                if verdict.code is Code.UNSCHEDULABLE:
                    failed[name] = verdict.message
                elif verdict.code is Code.UNRESOLVABLE:
                    unresolvable[name] = verdict.message
            fits = {n for n, (v, _) in again.items() if v.fits}
            passing = [n for n in names if (n in fits or (n in view.fits and n not in again))]
        return NamesResult(request, passing, failed, unresolvable, missing)

    def prioritize_names(
        self, pod: KubeObject, names: list[str], nodes: NodeTable, ledger: Ledger
    ) -> list[int]:
        """``prioritize`` over node names from the cache's table: 0..10 per name, in order."""
        request = self._asked(pod)
        if isinstance(request, Rejection) or not request.wants_gpu:
            return [0] * len(names)
        view = self._view(request, nodes, ledger, set(names))
        again = self._rebinding(request, names, nodes, ledger)
        fits = view.fits.get

        def raw(name: str) -> float | None:
            if name in again:
                verdict, score = again[name]
                return score if verdict.fits else None
            return fits(name)

        if not self.decider.relative:
            if not again:
                tens = list(map(view.tens.get, names, repeat(0)))
            else:
                tens = [absolute(again[n][1]) if n in again else view.tens.get(n, 0) for n in names]
        elif not again:
            tens = normalized(list(map(fits, names)))
        else:
            tens = normalized(list(map(raw, names)))
        return single_top(names, tens, raw if again else fits)

    def verdict(self, request: PodRequest, node: NodeInventory, ledger: Ledger) -> Verdict:
        """Filter one node, leaving the pod's own earlier holding out of the count."""
        return self.decisions(request, [node], ledger)[0][0]

    def filter(
        self, pod: KubeObject, nodes: Iterable[NodeInventory], ledger: Ledger
    ) -> FilterResult:
        """Verdicts for every node; an invalid pod fails everywhere with its reasons."""
        request = self._asked(pod)
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
        sigmoid values of nearby growths would all round to the same integer. Either way one
        node alone keeps the top score (``single_top``).
        ``request`` may pass the pod's request when the caller has already read it.
        """
        if request is None:
            request = self._asked(pod)
        nodes = list(nodes)
        if isinstance(request, Rejection) or not request.wants_gpu:
            return {n.name: 0 for n in nodes}
        decided = self.decisions(request, nodes, ledger)
        names = [n.name for n in nodes]
        raw = {n: s if v.fits else None for n, (v, s) in zip(names, decided, strict=True)}
        if not self.decider.relative:
            tens = [absolute(s) for _, s in decided]
        else:
            tens = normalized(list(raw.values()))
        return dict(zip(names, single_top(names, tens, raw.get), strict=True))

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
        ledger.assume(allocation, request.host)
        return allocation

    def unreserve(self, uid: str, ledger: Ledger) -> None:
        """Give back a reservation; idempotent."""
        ledger.unassume(uid)
