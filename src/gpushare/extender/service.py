"""The extender's decisions: filter, prioritize and bind over the cache.

Bind is where double-booking could happen, so it goes in this order:

1. read the pod fresh from the API (its resourceVersion guards the next write);
2. filter the node again and book the chosen GPUs in the ledger as an assumption; there is no
   ``await`` between check and booking, so two binds on one event loop cannot both pass;
3. write the annotations with a merge patch that carries the resourceVersion: if the pod
   changed meanwhile the server answers 409, the booking is given back and bind starts again
   (up to ``attempts`` times);
4. create the ``pods/binding``; if that fails, the booking and the annotations are removed and
   the error goes back to kube-scheduler, which retries the pod later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpushare.core.allocation import Allocation, to_annotations
from gpushare.core.explain import placement_message, refusal_summary
from gpushare.core.filtering import Code, Verdict
from gpushare.core.handoff import is_deferral
from gpushare.core.inventory import NodeInventory, read_node
from gpushare.core.kubejson import name_of
from gpushare.core.names import POD_ANNOTATIONS
from gpushare.core.requests import PodRequest, Rejection
from gpushare.core.scheduling import Scheduler
from gpushare.extender.events import SCHEDULED, UNSCHEDULABLE, EventRecorder, PodRef
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    NodeList,
)
from gpushare.kube.cache import ClusterCache
from gpushare.kube.port import Conflict, KubeAPI, KubeError

log = logging.getLogger(__name__)

MISSING = "node is not in gpushare's cache yet; it will be after the next watch event"


class Extender:
    """Serves kube-scheduler's filter, prioritize and bind calls."""

    def __init__(
        self,
        *,
        api: KubeAPI,
        cache: ClusterCache,
        scheduler: Scheduler,
        metrics: ExtenderMetrics | None = None,
        attempts: int = 3,
        clock_ns: Callable[[], int] = time.time_ns,
        events: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.events = events if events is not None else EventRecorder(api)
        self.cache = cache
        self.scheduler = scheduler
        self.metrics = metrics or ExtenderMetrics(lambda: cache)
        self.attempts = attempts
        self.clock_ns = clock_ns

    def _read_nodes(self, nodes: NodeList) -> list[NodeInventory]:
        """Inventories of whole node objects sent by a scheduler without a node cache."""
        settings = self.scheduler.settings
        return [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes.items]

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Split the given nodes into passing, failed and unresolvable, with reasons."""
        if args.Nodes is None:
            return self._filter_names(args)
        nodes = self._read_nodes(args.Nodes)
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
        self._count_filter(result.request, bool(passing))
        self._explain_filter(args.Pod, result.request, bool(passing), failed, unresolvable)
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
        self._count_filter(result.request, bool(result.passing))
        self._explain_filter(
            args.Pod, result.request, bool(result.passing), failed, result.unresolvable
        )
        # built without validation: the scheduler's values already have the wire's types, and
        # checking thousands of names again costs more than the decision
        return ExtenderFilterResult.model_construct(
            NodeNames=result.passing,
            FailedNodes=failed,
            FailedAndUnresolvableNodes=result.unresolvable,
        )

    def _count_filter(self, request: PodRequest | Rejection, fits: bool) -> None:
        outcome = (
            "rejected" if isinstance(request, Rejection) else ("fits" if fits else "unschedulable")
        )
        self.metrics.requests.labels("filter", outcome).inc()

    def _explain_filter(
        self,
        pod: dict[str, object],
        request: PodRequest | Rejection,
        fits: bool,
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> None:
        """Count hand-off deferrals; when no node fits, say why on the pod (an Event)."""
        if failed:
            distinct = set(failed.values())  # few distinct messages, even over thousands of nodes
            if any(map(is_deferral, distinct)):
                self.metrics.deferrals.inc(sum(map(is_deferral, failed.values())))
        if fits or not (failed or unresolvable):
            return
        if isinstance(request, PodRequest) and not request.wants_gpu:
            return
        reasons = [*failed.values(), *unresolvable.values()]
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        ref = PodRef(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
        )
        self.metrics.events.labels(UNSCHEDULABLE).inc()
        self.events.record(ref, "Warning", UNSCHEDULABLE, refusal_summary(reasons, len(reasons)))

    def _explain_bind(
        self, args: ExtenderBindingArgs, booked: Allocation, node: NodeInventory
    ) -> None:
        """Say on the pod where it went and how full its GPUs are now."""
        usage = self.cache.ledger.usage(node.name)
        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=booked.uid)
        self.metrics.events.labels(SCHEDULED).inc()
        self.events.record(ref, "Normal", SCHEDULED, placement_message(booked, node, usage))

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Scores 0..10 for the given nodes, as (hosts, scores); unknown names are left out."""
        self.metrics.requests.labels("prioritize", "ok").inc()
        if args.Nodes is None:
            nodes = self.cache.nodes
            names = list(filter(nodes.__contains__, args.NodeNames or []))
            scores = self.scheduler.prioritize_names(args.Pod, names, nodes, self.cache.ledger)
            return names, scores
        found = self._read_nodes(args.Nodes)
        by_name = self.scheduler.prioritize(args.Pod, found, self.cache.ledger)
        return [n.name for n in found], [by_name.get(n.name, 0) for n in found]

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Annotate then bind, never double-booking; see the module docstring."""
        key = f"{args.PodNamespace}/{args.PodName}"
        error = ""
        for attempt in range(1, self.attempts + 1):
            try:
                outcome, error = await self._bind_once(args, key)
            except Exception as err:  # a bug must not become a 500 with a booking left behind
                log.exception("pod=%s node=%s phase=bind unexpected error", key, args.Node)
                self.scheduler.unreserve(args.PodUID, self.cache.ledger)
                await self._clear(args, key)
                outcome, error = "error", f"bind {key}: internal error {type(err).__name__}: {err}"
            self.metrics.binds.labels(outcome).inc()
            if outcome == "bound":
                self.metrics.requests.labels("bind", "bound").inc()
                return ExtenderBindingResult()
            if outcome != "conflict":
                break
            log.info("pod=%s node=%s phase=bind conflict attempt=%d", key, args.Node, attempt)
        self.metrics.requests.labels("bind", "error").inc()
        log.warning("pod=%s node=%s phase=bind error=%r", key, args.Node, error)
        return ExtenderBindingResult(Error=error)

    async def _bind_once(self, args: ExtenderBindingArgs, key: str) -> tuple[str, str]:
        try:
            pod = await self.api.get_pod(args.PodNamespace, args.PodName)
        except KubeError as err:
            return "error", f"cannot read pod {key}: {err}"
        uid = str(pod.get("metadata", {}).get("uid", ""))
        if args.PodUID and uid != args.PodUID:
            return (
                "error",
                f"pod {key} was recreated (UID {uid}, scheduler asked for {args.PodUID})",
            )
        request = self.scheduler.read(pod)
        if isinstance(request, Rejection):
            return "rejected", f"pod {key}: {request.message}"
        node = self.cache.nodes.get(args.Node)
        if node is None:
            return "error", f"node {args.Node} is not in gpushare's cache"
        if not request.wants_gpu:
            try:
                await self.api.bind_pod(args.PodNamespace, args.PodName, uid, args.Node)
            except KubeError as err:
                return "error", f"bind {key} to {args.Node}: {err}"
            return "bound", ""
        booked = self.scheduler.reserve(request, node, self.cache.ledger, now_ns=self.clock_ns())
        if isinstance(booked, Verdict):
            return "unfit", f"pod {key} no longer fits node {args.Node}: {booked.message}"
        dev = node.gpu(booked.indexes[0])
        annotations = to_annotations(booked, dev_units=dev.mem_units if dev else 0)
        version = str(pod.get("metadata", {}).get("resourceVersion", ""))
        try:
            await self.api.patch_pod_annotations(
                args.PodNamespace, args.PodName, annotations, resource_version=version
            )
        except Conflict as err:
            self.scheduler.unreserve(uid, self.cache.ledger)
            self.metrics.conflicts.inc()
            return "conflict", f"pod {key} kept changing while binding: {err}"
        except KubeError as err:
            self.scheduler.unreserve(uid, self.cache.ledger)
            return "error", f"annotate {key}: {err}"
        try:
            await self.api.bind_pod(args.PodNamespace, args.PodName, uid, args.Node)
        except KubeError as err:
            self.scheduler.unreserve(uid, self.cache.ledger)
            await self._clear(args, key)
            return "error", f"bind {key} to {args.Node}: {err}"
        self._explain_bind(args, booked, node)
        log.info(
            "pod=%s node=%s gpu=%s mem=%d phase=bind bound",
            key,
            args.Node,
            ",".join(map(str, booked.indexes)),
            booked.mem_units,
        )
        return "bound", ""

    async def _clear(self, args: ExtenderBindingArgs, key: str) -> None:
        """Remove our annotations after a failed binding (best effort)."""
        try:
            await self.api.patch_pod_annotations(
                args.PodNamespace, args.PodName, dict.fromkeys(POD_ANNOTATIONS), resource_version=""
            )
        except KubeError as err:
            log.warning("pod=%s phase=unreserve cannot clear annotations: %s", key, err)
