"""Filtering and prioritizing: which of kube-scheduler's nodes fit a pod, and in what order.

A filter starts a new attempt for the pod (its old intent goes back), asks the core for a
verdict per node, keeps only the nodes of the unit a ResourcePolicy opens to the pod, and for
most pods of the packing profile answers with the top node alone, its GPUs booked as the pod's
intent (``Filtering.top_only``). Prioritize scores the nodes and books the intent for the
node it puts alone on top.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.kubejson import KubeObject, labels_of, name_of, pod_spec_of
from gpushare.core.model.requests import PodRequest, Rejection
from gpushare.core.placement.filtering import Code
from gpushare.core.placement.preferences import stated_preference
from gpushare.core.resourcepolicies.policyplugin import filter_units
from gpushare.extender.intents import Intents
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.telling import Telling
from gpushare.extender.wire import ExtenderArgs, ExtenderFilterResult, NodeList
from gpushare.kube.cache import ClusterCache

MISSING = "node is not in gpushare's cache yet; it will be after the next watch event"


@dataclass(eq=False, kw_only=True)
class Filtering:
    """Serves kube-scheduler's filter and prioritize calls."""

    cache: ClusterCache
    scheduler: Scheduler
    metrics: ExtenderMetrics
    intents: Intents
    telling: Telling
    clock_ns: Callable[[], int]
    packing_profile: str
    """The kube-scheduler profile (``schedulerName``) configured as
    ``schedconfig.packing_profile``: for its pods that state no preference the filter
    answers with the top node alone (``top_only``); empty for never."""

    def read_nodes(self, nodes: NodeList) -> list[NodeInventory]:
        """Inventories of whole node objects sent by a scheduler without a node cache."""
        settings = self.scheduler.settings
        return [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes.items]

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Split the given nodes into passing, failed and unresolvable, with reasons."""
        self.intents.new_attempt(args.Pod)
        if args.Nodes is None:
            return self._filter_names(args)
        nodes = self.read_nodes(args.Nodes)
        result = self.scheduler.filter(args.Pod, nodes, self.cache.ledger)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        passing: set[str] = set()
        for verdict in result.verdicts:
            if verdict.code is Code.FITS:
                passing.add(verdict.node)
            elif verdict.code is Code.UNSCHEDULABLE:
                failed[verdict.node] = verdict.message
            else:
                unresolvable[verdict.node] = verdict.message
        labels = {name_of(n): labels_of(n) for n in args.Nodes.items}
        passing = set(self._gate(args.Pod, sorted(passing), failed, unresolvable, labels))
        self.telling.filtered(args.Pod, result.request, bool(passing), failed, unresolvable)
        self.intents.waits(args.Pod, result.request, bool(passing))
        kept = [n for n in args.Nodes.items if name_of(n) in passing]
        return ExtenderFilterResult(
            Nodes=NodeList(items=kept), FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable
        )

    def _filter_names(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """The ``nodeCacheCapable`` path: names in, names out, answered from the cache."""
        result = self.scheduler.filter_names(
            args.Pod, args.NodeNames or [], self.cache.nodes, self.cache.ledger
        )
        failed = result.failed
        for name in result.missing:
            failed[name] = MISSING
        passing = result.passing
        if self.cache.book is not None:
            passing = self._gate(
                args.Pod, passing, failed, result.unresolvable, self.cache.book.node_labels
            )
        fits = bool(passing)
        self.telling.filtered(args.Pod, result.request, fits, failed, result.unresolvable)
        self.intents.waits(args.Pod, result.request, fits)  # until GPUs come back
        top = self.top_only(args.Pod, result.request, passing)
        if top and len(passing) > 1:
            return ExtenderFilterResult(NodeNames=[top], FailedNodes={})
        return ExtenderFilterResult(
            NodeNames=passing,
            FailedNodes=failed,
            FailedAndUnresolvableNodes=result.unresolvable,
        )

    def top_only(self, pod: KubeObject, request: PodRequest | Rejection, passing: list[str]) -> str:
        """The one node to answer the filter with, its GPUs booked as the pod's intent; empty
        to answer with every fitting node.

        kube-scheduler takes a lone feasible node without scoring or calling prioritize
        (``schedulePod``, pkg/scheduler/schedule_one.go), which saves a round trip and its
        score plugins per pod. It would have taken the extender's top node anyway when the pod
        is in the packing profile and nothing kube-scheduler still scores there differs
        between nodes (``core.placement.preferences``). When only one node fits it has no choice
        either: the answer stays as it is, and this books the intent prioritize would have.
        With the top node alone the other nodes' reasons are left out: kube-scheduler reads
        them only when no node is left. With every node, prioritize books the intent.
        """
        if not passing or not isinstance(request, PodRequest) or not request.wants_gpu:
            return ""
        why = ""
        if len(passing) > 1:
            why = self._why_every_node(pod, passing)
        if not why:
            nodes, ledger = self.cache.nodes, self.cache.ledger
            name = self.scheduler.top_name(request, passing, nodes, ledger)
            if name and not self.intents.may_intend(pod):
                self.metrics.filter_answers.labels("top_node").inc()
                return name  # kube-scheduler's choice all the same, with nothing booked
            until = self.intents.deadline(pod)
            top = self.intents.booked(
                self.scheduler.intend_on(request, name, nodes, ledger, until_ns=until)
            )
            if top:
                self.metrics.filter_answers.labels("top_node").inc()
                return top
            why = "no_score"
        self.metrics.filter_answers.labels(why).inc()
        return ""

    def _why_every_node(self, pod: KubeObject, passing: list[str]) -> str:
        """Why kube-scheduler's own scores may prefer another fitting node; empty if not."""
        if pod_spec_of(pod).get("schedulerName") != self.packing_profile:
            return "other_profile"
        if stated_preference(pod):
            return "stated_preference"
        if self.cache.placed_terms.matching(pod):
            return "placed_affinity"
        tainted = self.cache.soft_tainted
        if tainted and any(name in tainted for name in passing):
            return "prefer_no_schedule_taint"
        return ""

    def _gate(
        self,
        pod: KubeObject,
        passing: list[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
        node_labels: Mapping[str, Mapping[str, str]],
    ) -> list[str]:
        """Keep only the passing nodes of the unit a ResourcePolicy opens to the pod."""
        now_s = self.clock_ns() / 1e9
        book = self.cache.book
        return filter_units(book, pod, passing, failed, unresolvable, node_labels, now_s=now_s)

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Scores 0..10 for the given nodes, as (hosts, scores); unknown names are left out."""
        self.metrics.requests.labels("prioritize", "ok").inc()
        if args.Nodes is None:
            nodes = self.cache.nodes
            names = list(filter(nodes.__contains__, args.NodeNames or []))
            scores = self.scheduler.prioritize_names(args.Pod, names, nodes, self.cache.ledger)
            self.intents.intend(args.Pod, names, scores, nodes)
            return names, scores
        found = self.read_nodes(args.Nodes)
        by_name = self.scheduler.prioritize(args.Pod, found, self.cache.ledger)
        names = [n.name for n in found]
        scores = [by_name.get(n.name, 0) for n in found]
        self.intents.intend(args.Pod, names, scores, {n.name: n for n in found})
        return names, scores
