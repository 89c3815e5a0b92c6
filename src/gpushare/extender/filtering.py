"""Filtering and prioritizing: which of kube-scheduler's nodes fit a pod, and in what order.

A filter is one core call (``core.decision.verbs.filter_pod``): it starts a new attempt for
the pod (its old intent goes back, and the intents past their deadline), decides every node,
keeps only the nodes of the unit a ResourcePolicy opens to the pod, and for most pods of the
packing profile picks the top node alone and books its GPUs as the pod's intent. What it
returns is all this adapter needs: it builds the answer from it, counts and tells.
Prioritize is one core call too (``prioritize_pod``): it scores the nodes and books the
intent for the node it puts alone on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.decision.verbs import FilterAsk, PrioritizeAsk, filter_pod, prioritize_pod
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.kubejson import labels_of, name_of
from gpushare.extender.intents import Intents
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.telling import Telling
from gpushare.extender.wire import ExtenderArgs, ExtenderFilterResult, NodeList


@dataclass(eq=False, kw_only=True)
class Filtering:
    """Serves kube-scheduler's filter and prioritize calls."""

    state: ClusterState
    scheduler: Scheduler
    metrics: ExtenderMetrics
    intents: Intents
    telling: Telling
    clock_ns: Callable[[], int]
    packing_profile: str
    """The kube-scheduler profile (``schedulerName``) configured as
    ``schedconfig.packing_profile``: for its pods that state no preference the filter
    answers with the top node alone (``core.decision.verbs``); empty for never."""

    def read_nodes(self, nodes: NodeList) -> list[NodeInventory]:
        """Inventories of whole node objects sent by a scheduler without a node cache."""
        settings = self.scheduler.settings
        return [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes.items]

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Split the given nodes into passing, failed and unresolvable, with reasons: one core
        call (``core.decision.verbs.filter_pod``), then the answer, the counters and the
        Events from what it returns."""
        pod, intents = args.Pod, self.intents
        ask = FilterAsk(
            pod=pod,
            names=args.NodeNames or [],
            nodes=None if args.Nodes is None else self.read_nodes(args.Nodes),
            node_labels=(
                None if args.Nodes is None else {name_of(n): labels_of(n) for n in args.Nodes.items}
            ),
            **intents.terms(self.clock_ns()),
            stuck=intents.stuck_pods,
            packing_profile=self.packing_profile,
        )
        outcome = filter_pod(self.scheduler, self.state, ask, intents.waiting)
        intents.filtered(outcome)
        self.telling.filtered(
            pod,
            outcome.request,
            outcome.fits,
            outcome.failed,
            outcome.unresolvable,
            outcome.deferred,
        )
        if outcome.answer:
            self.metrics.filter_answers.labels(outcome.answer).inc()
        if args.Nodes is not None:
            passing = set(outcome.passing)
            kept = [n for n in args.Nodes.items if name_of(n) in passing]
            return ExtenderFilterResult(
                Nodes=NodeList(items=kept),
                FailedNodes=outcome.failed,
                FailedAndUnresolvableNodes=outcome.unresolvable,
            )
        if outcome.one_node:
            return ExtenderFilterResult(NodeNames=[outcome.top], FailedNodes={})
        return ExtenderFilterResult(
            NodeNames=outcome.passing,
            FailedNodes=outcome.failed,
            FailedAndUnresolvableNodes=outcome.unresolvable,
        )

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Scores 0..10 for the given nodes, as (hosts, scores); unknown names are left out."""
        self.metrics.requests.labels("prioritize", "ok").inc()
        ask = PrioritizeAsk(
            pod=args.Pod,
            names=args.NodeNames or [],
            nodes=None if args.Nodes is None else self.read_nodes(args.Nodes),
            **self.intents.terms(self.clock_ns()),
            stuck=self.intents.stuck_pods,
        )
        outcome = prioritize_pod(self.scheduler, self.state, ask)
        self.intents.prioritized(outcome)
        return outcome.names, outcome.scores
