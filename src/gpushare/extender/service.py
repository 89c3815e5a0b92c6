"""The extender's decisions: filter, prioritize and bind over the cache.

Bind is where double-booking could happen, so it goes in this order:

1. take the pod as the cache's watch last showed it (its resourceVersion guards the next
   write, so a copy the watch had not caught up with fails that write with a 409 and bind
   starts again from a fresh read, as it does when the copy says the pod no longer fits or
   is invalid); read it instead when the watch has no copy, or when the pod already holds a
   booking other than its intent (kept by an earlier bind whose outcome was unknown);
2. filter the node again and book the chosen GPUs in the ledger as an assumption; there is no
   ``await`` between check and booking, so two binds on one event loop cannot both pass. The
   booking replaces the pod's intent, the GPUs prioritize booked for it on its top node
   (``core.ledger``), so the pods kube-scheduler sent on meanwhile were not given them;
3. create the ``pods/binding`` carrying the annotations and the resourceVersion: the API server
   sets the node and the annotations in one update, or answers 409 when the pod changed or was
   bound meanwhile; then this try's booking is given back (a booking the pod held before it,
   kept from a bind whose outcome was unknown, comes back) and bind starts again (up to
   ``attempts`` times). Only labels (a ResourcePolicy unit's ``podLabels``) and the removal of an
   annotation the pod already carries take a merge patch first, with the same check;
4. if the binding fails, the booking (and annotations a patch wrote) are removed and the error
   goes back to kube-scheduler, which retries the pod later.

A bound pod is never re-planned, rewritten or cleared. kube-scheduler retries a bind whose reply
was late, and a binding can time out after the API server stored it; clearing then would leave
a running pod with no record of its GPU, and the next pod would be booked on top of it. So:

- a bind for a pod the API already shows bound writes nothing: it succeeds when the pod is on
  that node with its allocation (``core.binding``), and fails otherwise, changing nothing;
- after a failed binding the pod is read again: bound to the booked node means success (the
  binding went through), bound elsewhere means failure with the annotations kept, and only a
  pod still unbound is cleared, with its resourceVersion, so a binding that lands meanwhile
  turns the clearing into a 409 instead of a bound pod without annotations. When the pod cannot
  be read, annotations and booking stay (holding a GPU too long is safe; double-booking is not);
- binds of one pod run one at a time, so a retry arriving while the first bind is still
  waiting on the API finds its outcome instead of racing it.

The annotations bind writes carry a seal (``gpushare.io/seal``, core.trust) made with the key
the cache judges by, over the pod's UID, namespace, name, the node and the allocation record as
written: every reader counts an allocation only when its seal verifies, so a tenant's own
annotations place nothing. An allocation the cache ignores is counted
(``gpushare_untrusted_allocations_total``, once per pod and reason) and said on the pod with one
Warning Event per pod UID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

from gpushare.core.allocation import Allocation, to_annotations
from gpushare.core.binding import already_bound
from gpushare.core.explain import placement_message, refusal_summary, scheduler_says_it
from gpushare.core.filtering import Code, Verdict
from gpushare.core.gating import (
    ANN_DELETION_COST,
    ANN_POLICY,
    ANN_UNIT,
    Gate,
    deletion_cost,
    summary,
)
from gpushare.core.handoff import is_deferral
from gpushare.core.inventory import NodeInventory, read_node
from gpushare.core.kubejson import (
    KubeObject,
    annotations_of,
    key_of,
    labels_of,
    name_of,
    namespace_of,
    node_name_of,
    pod_spec_of,
    stored_uid_of,
    uid_of,
)
from gpushare.core.ledger import Kept
from gpushare.core.names import (
    ANN_ALLOCATION,
    ANN_RETRY,
    ANN_SEAL,
    POD_ANNOTATIONS,
    SCHEDULER_NAME,
)
from gpushare.core.preferences import stated_preference
from gpushare.core.requests import PodRequest, Rejection
from gpushare.core.resourcepolicy import GROUP, KIND, VERSION, PolicyError, ResourcePolicy
from gpushare.core.scheduling import Scheduler
from gpushare.core.trust import Ignored
from gpushare.core.waiting import Waiting, WaitingPod
from gpushare.extender.events import (
    POLICY_NOTICE,
    POLICY_UNIT,
    SCHEDULED,
    UNSCHEDULABLE,
    UNTRUSTED,
    EventKind,
    EventRecorder,
    PodRef,
)
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    NodeList,
)
from gpushare.kube.cache import ClusterCache
from gpushare.kube.port import Conflict, KubeAPI, KubeDict, KubeError, NotFound

log = logging.getLogger(__name__)

MISSING = "node is not in gpushare's cache yet; it will be after the next watch event"

INTENT_TTL_S = 30.0
"""How long an intent booked at prioritize waits for its bind (``core.ledger``).

kube-scheduler binds within milliseconds of choosing, unless a Permit plugin makes the pod
wait; a pod it retried is filtered again first, which gives the old intent back at once. So
the deadline matters when no call for the pod comes for a while: the pod waits in PreBind
(VolumeBinding waits up to 10 minutes for a volume to be provisioned, one that never is
included), kube-scheduler stopped, or the pod left for another scheduler. The deadline runs
from the booking and is kept by the clock (``sweep``), not by the next call, so however long
the pod waits its share is free again after this long, and the pods refused meanwhile are
tried again. Letting it go early is safe (bind checks the node again) but would bring back
the retries intents remove.
"""

UNSEEN_TTL_S = 3.0
"""How long an intent lasts for a pod the watch has not shown unbound yet (``_intent_deadline``).

kube-scheduler often filters a new pod a moment before the extender's own watch brings it
(both follow the same API server), so such a pod still books. But anything that reaches the
port can send a filter for a pod that does not exist, and its intent would hold GPUs for
nobody: so it lasts this long, and gets the full ``INTENT_TTL_S`` from its booking only once
the watch shows the pod (``sweep``)."""

SWEEP_S = 1.0
"""How often the intents past their deadline are given back (``Extender.keep_intents``)."""

RETRIES_PER_SWEEP = 20
"""At most this many refused pods are touched per sweep (``core.waiting``): a crowd of them
costs the API server 20 writes a second at most, however much capacity comes back."""

SUCCESS = frozenset({"bound", "already_bound"})
"""Bind outcomes that answer kube-scheduler with success."""

DECIDED_FROM_THE_COPY = frozenset({"conflict", "unfit", "rejected"})
"""Bind outcomes reached with nothing written: from the watch's copy of the pod, bind checks
them again on a fresh read. Errors are not among them: after a write whose effect is unknown
the booking must stay as ``_settle`` left it."""


class _OnePerKey:
    """One holder at a time per key; a key's lock lives only while someone holds or waits."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


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
        intent_ttl_s: float = INTENT_TTL_S,
        packing_profile: str = SCHEDULER_NAME,
        scheduler_reports: bool = False,
    ) -> None:
        self.api = api
        self.scheduler_reports = scheduler_reports
        """Whether a kube-scheduler calls this extender, and so writes the filter's reasons into
        its own FailedScheduling event: then ``GPUShareUnschedulable`` is written only where
        that event cannot carry them whole (``core.explain.scheduler_says_it``), so a pending
        pod gets one Warning, not two that say the same. The demo and tests drive the extender
        without kube-scheduler, and keep it."""
        self.packing_profile = packing_profile
        """The kube-scheduler profile (``schedulerName``) configured as
        ``schedconfig.packing_profile``: for its pods that state no preference the filter
        answers with the top node alone (``_top_only``); empty for never."""
        self.intent_ttl_s = intent_ttl_s
        self.events = events if events is not None else EventRecorder(api)
        self.cache = cache
        self.scheduler = scheduler
        if scheduler.cluster is None:  # scarce shapes are priced over every node in the cache
            scheduler.cluster = lambda: cache.nodes
        self.metrics = metrics or ExtenderMetrics(lambda: cache)
        self.attempts = attempts
        self.clock_ns = clock_ns
        self._binding = _OnePerKey()
        self.waiting = Waiting()
        """GPU pods the filter refused, tried again when GPUs come back (``sweep``)."""
        self._retry_before = 0
        """``Waiting.mark`` when GPUs last came back: the pods refused before it are due."""
        self._stuck: dict[str, set[str]] = {}
        """By namespace: pods whose intent ran out with no bind, while pending (``_may_intend``)."""
        self._unseen: dict[str, int] = {}
        """Intents of pods the watch had not shown yet, by UID: the deadline each gets once it
        does (``UNSEEN_TTL_S``)."""
        if cache.on_ignored is None:
            cache.on_ignored = self._ignored
        if cache.on_skipped is None:
            cache.on_skipped = self._skipped

    def _skipped(self, kind: str, obj: KubeObject, why: str) -> None:
        """Count a watched object the cache could not take in (the cache logs it)."""
        reason = "shape" if why.startswith(kind) else "error"
        self.metrics.skipped.labels(kind, reason).inc()

    def _ignored(self, pod: KubeObject, why: Ignored, *, first: bool) -> None:
        """Count an ignored allocation; on its pod's first, say so on the pod (an Event)."""
        key = key_of(pod)
        self.metrics.untrusted.labels(why.reason.value).inc()
        log.warning("pod=%s phase=trust allocation ignored: %s", key, why.message)
        if not first:
            return
        self._tell(
            PodRef.of(pod),
            "Warning",
            UNTRUSTED,
            f"gpushare ignores this pod's {ANN_ALLOCATION} annotation ({why.message}): only "
            f"allocations gpushare's scheduler wrote and sealed for this pod count, so it holds "
            f"no GPU share; create it with schedulerName {SCHEDULER_NAME} and without "
            f"spec.nodeName or gpushare annotations",
        )

    def policy_notice(self, policy: ResourcePolicy | PolicyError, notice: str) -> None:
        """Say on a ResourcePolicy what in it gpushare does not do or refuses (a Warning Event)."""
        ref = PodRef(
            namespace=policy.namespace,
            name=policy.name,
            uid=policy.uid,
            kind=KIND,
            api_version=f"{GROUP}/{VERSION}",
        )
        self._tell(ref, "Warning", POLICY_NOTICE, notice)

    def _explain_unit(self, args: ExtenderBindingArgs, uid: str, gate: Gate | None) -> None:
        """Say on the pod which unit of its ResourcePolicy took it, and why earlier ones did not."""
        if gate is None or gate.chosen is None:
            return
        unit = gate.chosen

        def message() -> str:
            where = (
                f"ResourcePolicy {gate.policy} placed this pod in {unit.describe()} on {args.Node}"
            )
            if gate.passed:
                return f"{where}; it moved on because {summary(gate.passed)}"
            return f"{where}, the first unit, which had room"

        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=uid)
        self._tell(ref, "Normal", POLICY_UNIT, message)

    def _read_nodes(self, nodes: NodeList) -> list[NodeInventory]:
        """Inventories of whole node objects sent by a scheduler without a node cache."""
        settings = self.scheduler.settings
        return [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes.items]

    def _new_attempt(self, pod: KubeObject) -> None:
        """Before a filter: give back the intents that expired, and the pod's own, since
        kube-scheduler tries a pod again only after its previous attempt has ended."""
        self._expire()
        if self.scheduler.drop_intent(uid_of(pod), self.cache.ledger):
            self.metrics.intents.labels("dropped").inc()

    def _expire(self) -> None:
        """Give back the intents past their deadline; their GPUs are free again."""
        expired = self.cache.ledger.expire(self.clock_ns())
        if expired:
            self.metrics.intents.labels("expired").inc(len(expired))
            self._capacity_returned()
            pending = self.cache.pending
            for uid in expired:
                pod = pending.get(uid)
                if pod is not None:
                    self._stuck.setdefault(namespace_of(pod), set()).add(uid)

    def _confirm_seen(self) -> None:
        """Give the intents of pods the watch now shows their full deadline (``UNSEEN_TTL_S``);
        forget the ones that ended."""
        ledger, pending = self.cache.ledger, self.cache.pending
        for uid, until in list(self._unseen.items()):
            if ledger.intent_until(uid) is None:
                del self._unseen[uid]
            elif uid in pending:
                ledger.extend(uid, until)
                del self._unseen[uid]

    def _capacity_returned(self) -> None:
        """GPUs came back without an event kube-scheduler sees: the pods refused until now are
        due to be tried again (``sweep``)."""
        self._retry_before = self.waiting.mark()

    def _waits(self, pod: KubeObject, request: PodRequest | Rejection, fits: bool) -> None:
        """Remember a GPU pod refused on every node until GPUs come back; forget one that
        fits somewhere (or asks for none)."""
        uid = stored_uid_of(pod)
        if fits or not isinstance(request, PodRequest) or not request.wants_gpu:
            self.waiting.forget(uid)
        elif uid:
            self.waiting.refused(WaitingPod(uid, namespace_of(pod), name_of(pod)))

    def _stuck_in(self, namespace: str) -> set[str]:
        """The namespace's pods whose intent ran out with no bind and that are still pending."""
        stuck = self._stuck.get(namespace)
        if stuck is None:
            return set()
        pending = self.cache.pending
        stuck.difference_update([uid for uid in stuck if uid not in pending])
        if not stuck:
            del self._stuck[namespace]
        return stuck

    def sweep(self) -> list[WaitingPod]:
        """Give back the intents past their deadline; the refused pods to try again now.

        Those are the pods refused before GPUs last came back, still unbound, at most
        ``RETRIES_PER_SWEEP`` (``core.waiting``); the rest come at the next sweeps.
        """
        self._confirm_seen()
        self._expire()
        for namespace in list(self._stuck):
            self._stuck_in(namespace)  # forget the pods bound or gone meanwhile
        pending = self.cache.pending
        taken = self.waiting.take(RETRIES_PER_SWEEP, before=self._retry_before)
        return [pod for pod in taken if pod.uid in pending]

    async def retry(self, pods: list[WaitingPod]) -> None:
        """Ask kube-scheduler to try these refused pods again: an annotation on each is an
        update of the pod, which moves a pod only the extender refused back to its queue
        (``core.waiting``). A pod gone meanwhile is skipped; a failed write is logged."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock_ns() / 1e9))
        for pod in pods:
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace, pod.name, {ANN_RETRY: stamp}, resource_version=""
                )
            except NotFound:
                self.metrics.retries.labels("gone").inc()
                continue
            except KubeError as err:
                self.metrics.retries.labels("error").inc()
                log.warning("pod=%s/%s phase=retry cannot touch: %s", pod.namespace, pod.name, err)
                continue
            self.metrics.retries.labels("touched").inc()

    async def keep_intents(self, period_s: float = SWEEP_S) -> None:
        """Every ``period_s``: give back the intents past their deadline and try the refused
        pods again (``sweep``, ``retry``); runs for the app's lifetime."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.retry(self.sweep())
            except Exception:  # the next sweep must still come
                log.exception("phase=sweep unexpected error")

    def _intend(
        self,
        pod: KubeObject,
        names: list[str],
        scores: list[int],
        nodes: Mapping[str, NodeInventory],
    ) -> str:
        """Book the top node's GPUs for the pod until its bind comes (``Scheduler.intend``);
        the node booked, or an empty string."""
        if not self._may_intend(pod):
            return ""
        until = self._intent_deadline(pod)
        booked = self.scheduler.intend(pod, names, scores, nodes, self.cache.ledger, until_ns=until)
        return self._booked(booked)

    def _may_intend(self, pod: KubeObject) -> bool:
        """Whether the pod's namespace may book intents: not while one of its pods whose intent
        ran out with no bind is still pending (``_stuck``); counted as withheld.

        Such a pod waits past PreBind or Permit (a volume never provisioned, say), and a pod
        of the same tenant created next would most likely wait the same way: its intent would
        only hold GPUs from everyone else for another 30 s. Without one nothing is refused,
        the pod only loses the protection from a race at bind, which checks the node again.
        """
        if not self._stuck_in(namespace_of(pod)):
            return True
        self.scheduler.drop_intent(uid_of(pod), self.cache.ledger)
        self.metrics.intents.labels("withheld").inc()
        return False

    def _intent_deadline(self, pod: KubeObject) -> int:
        """When an intent booked now expires unless its bind comes (``intent_ttl_s``); for a
        pod the watch has not shown unbound, ``UNSEEN_TTL_S`` until it does (counted as
        unseen)."""
        until = self.clock_ns() + int(self.intent_ttl_s * 1e9)
        uid = stored_uid_of(pod)
        if uid in self.cache.pending:
            self._unseen.pop(uid, None)
            return until
        self.metrics.intents.labels("unseen").inc()
        self._unseen[uid] = until
        return min(until, self.clock_ns() + int(UNSEEN_TTL_S * 1e9))

    def _booked(self, booked: Allocation | None) -> str:
        """Count a booked intent; the node it is on, or an empty string for none."""
        if booked is None:
            return ""
        self.metrics.intents.labels("booked").inc()
        return booked.node

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Split the given nodes into passing, failed and unresolvable, with reasons."""
        self._new_attempt(args.Pod)
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
        labels = {name_of(n): labels_of(n) for n in args.Nodes.items}
        passing = set(self._gate(args.Pod, sorted(passing), failed, unresolvable, labels))
        self._filtered(args.Pod, result.request, bool(passing), failed, unresolvable)
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
        self._filtered(args.Pod, result.request, bool(passing), failed, result.unresolvable)
        top = self._top_only(args.Pod, result.request, passing)
        if top and len(passing) > 1:
            return ExtenderFilterResult(NodeNames=[top], FailedNodes={})
        return ExtenderFilterResult(
            NodeNames=passing,
            FailedNodes=failed,
            FailedAndUnresolvableNodes=result.unresolvable,
        )

    def _top_only(
        self, pod: KubeObject, request: PodRequest | Rejection, passing: list[str]
    ) -> str:
        """The one node to answer the filter with, its GPUs booked as the pod's intent; empty
        to answer with every fitting node.

        kube-scheduler takes a lone feasible node without scoring or calling prioritize
        (``schedulePod``, pkg/scheduler/schedule_one.go), which saves a round trip and its
        score plugins per pod. It would have taken the extender's top node anyway when the pod
        is in the packing profile and nothing kube-scheduler still scores there differs
        between nodes (``core.preferences``). When only one node fits it has no choice
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
            if name and not self._may_intend(pod):
                self.metrics.filter_answers.labels("top_node").inc()
                return name  # kube-scheduler's choice all the same, with nothing booked
            until = self._intent_deadline(pod)
            top = self._booked(
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
        """Keep only the passing nodes of the unit a ResourcePolicy opens to the pod.

        A node refused here gets the gate's reason: unresolvable when the policy cannot order
        the pod at all (fixing the policy or the pod is the way out), else unschedulable.
        """
        book = self.cache.book
        if book is None:
            return passing
        gate = book.gate(pod, fitting=passing, now_s=self.clock_ns() / 1e9)
        if gate is None:
            return passing
        if gate.error:
            for name in passing:
                unresolvable[name] = gate.error
            return []
        kept = []
        for name in passing:
            if gate.allows(node_labels.get(name, {})):
                kept.append(name)
            else:
                failed[name] = gate.reason
        return kept

    def _filtered(
        self,
        pod: KubeObject,
        request: PodRequest | Rejection,
        fits: bool,
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> None:
        """After a filter: count it and the hand-off deferrals; when no node fits, say why on
        the pod (an Event) and remember a GPU pod until GPUs come back (``_waits``)."""
        outcome = (
            "rejected" if isinstance(request, Rejection) else ("fits" if fits else "unschedulable")
        )
        self.metrics.requests.labels("filter", outcome).inc()
        self._waits(pod, request, fits)
        if failed:
            distinct = set(failed.values())  # few distinct messages, even over thousands of nodes
            if any(map(is_deferral, distinct)):
                self.metrics.deferrals.inc(sum(map(is_deferral, failed.values())))
        if fits or not (failed or unresolvable):
            return
        if isinstance(request, PodRequest) and not request.wants_gpu:
            return
        reasons = [*failed.values(), *unresolvable.values()]
        if self.scheduler_reports and scheduler_says_it(reasons, len(reasons)):
            return
        self._tell(PodRef.of(pod), "Warning", UNSCHEDULABLE, refusal_summary(reasons, len(reasons)))

    def _explain_bind(
        self, args: ExtenderBindingArgs, booked: Allocation, node: NodeInventory
    ) -> None:
        """Say on the pod where it went and how full its GPUs are now."""
        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=booked.uid)
        self._tell(
            ref,
            "Normal",
            SCHEDULED,
            lambda: placement_message(booked, node, self.cache.ledger.usage(node.name)),
        )

    def _tell(
        self, ref: PodRef, kind: EventKind, reason: str, message: str | Callable[[], str]
    ) -> None:
        """Queue an Event and count it, or count it skipped when the recorder's cap on Normal
        events is spent (``message`` may be a function, so a skipped one is never built)."""
        if not self.events.allows(kind):
            self.metrics.events_skipped.labels(reason).inc()
            return
        self.metrics.events.labels(reason).inc()
        self.events.record(ref, kind, reason, message if isinstance(message, str) else message())

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Scores 0..10 for the given nodes, as (hosts, scores); unknown names are left out."""
        self.metrics.requests.labels("prioritize", "ok").inc()
        if args.Nodes is None:
            nodes = self.cache.nodes
            names = list(filter(nodes.__contains__, args.NodeNames or []))
            scores = self.scheduler.prioritize_names(args.Pod, names, nodes, self.cache.ledger)
            self._intend(args.Pod, names, scores, nodes)
            return names, scores
        found = self._read_nodes(args.Nodes)
        by_name = self.scheduler.prioritize(args.Pod, found, self.cache.ledger)
        names = [n.name for n in found]
        scores = [by_name.get(n.name, 0) for n in found]
        self._intend(args.Pod, names, scores, {n.name: n for n in found})
        return names, scores

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Annotate then bind, never double-booking; see the module docstring."""
        key = f"{args.PodNamespace}/{args.PodName}"
        async with self._binding.hold(key):
            return await self._bind(args, key)

    async def _bind(self, args: ExtenderBindingArgs, key: str) -> ExtenderBindingResult:
        error = ""
        # the watch's copy of the pod saves a read (see the module docstring), but only while
        # the pod holds nothing or its intent: a booking kept from an earlier bind whose outcome
        # was unknown (the API server stalled) must meet the pod as it is now, not as the watch,
        # stalled with it, last showed it
        watched = self.cache.pending.get(args.PodUID) if args.PodUID else None
        ledger = self.cache.ledger
        if watched is not None and (
            ledger.holding(args.PodUID) is not None and ledger.intent_until(args.PodUID) is None
        ):
            watched = None
        attempt = 0
        while attempt < self.attempts:
            attempt += watched is None  # a try on the watched copy is not one of them
            try:
                outcome, error = await self._bind_once(args, key, watched)
            except Exception as err:  # a bug must not become a 500 with a booking left behind
                log.exception("pod=%s node=%s phase=bind unexpected error", key, args.Node)
                error = f"bind {key}: internal error {type(err).__name__}: {err}"
                outcome, error = await self._settle(args, key, args.PodUID, error)
            if watched is not None and outcome in DECIDED_FROM_THE_COPY:
                # A write carries the copy's resourceVersion, so a success was checked against
                # the API; these answers came from the copy before any write: read, try again.
                if outcome == "conflict":
                    self.metrics.binds.labels(outcome).inc()
                watched = None
                continue
            self.metrics.binds.labels(outcome).inc()
            if outcome in SUCCESS:
                self.metrics.requests.labels("bind", "bound").inc()
                return ExtenderBindingResult()
            if outcome != "conflict":
                break
            log.info("pod=%s node=%s phase=bind conflict attempt=%d", key, args.Node, attempt)
        self.metrics.requests.labels("bind", "error").inc()
        if args.PodUID and self.scheduler.drop_intent(args.PodUID, self.cache.ledger):
            self.metrics.intents.labels("dropped").inc()  # the pod will be tried again
            self._capacity_returned()
        log.warning("pod=%s node=%s phase=bind error=%r", key, args.Node, error)
        return ExtenderBindingResult(Error=error)

    async def _bind_once(
        self, args: ExtenderBindingArgs, key: str, watched: KubeDict | None = None
    ) -> tuple[str, str]:
        """One try: from the watched copy of the pod when given, else from a fresh read."""
        if watched is not None:
            pod = watched
        else:
            try:
                pod = await self.api.get_pod(args.PodNamespace, args.PodName)
            except KubeError as err:
                return "error", f"cannot read pod {key}: {err}"
        uid = stored_uid_of(pod)
        if args.PodUID and uid != args.PodUID:
            return (
                "error",
                f"pod {key} was recreated (UID {uid}, scheduler asked for {args.PodUID})",
            )
        request = self.scheduler.read(pod)
        if node_name_of(pod):
            return self._already_bound(pod, args, key, request)
        if isinstance(request, Rejection):
            return "rejected", f"pod {key}: {request.message}"
        node = self.cache.nodes.get(args.Node)
        if node is None:
            return "error", f"node {args.Node} is not in gpushare's cache"
        gate = self._unit_for(pod, args.Node)
        if isinstance(gate, tuple):
            return gate
        version = str(pod.get("metadata", {}).get("resourceVersion", ""))
        annotations: dict[str, str | None] = {}
        labels: dict[str, str] = {}
        if gate is not None and gate.chosen is not None:
            book = self.cache.book
            assert book is not None
            book.assume(book.placement(pod, args.Node, gate))  # no await since the check
            unit = gate.chosen
            annotations.update(unit.pod_annotations)
            annotations[ANN_POLICY] = gate.policy.split("/", 1)[1]
            annotations[ANN_UNIT] = str(unit.number)
            annotations[ANN_DELETION_COST] = str(deletion_cost(unit))
            labels.update(unit.pod_labels)
        if not request.wants_gpu:
            failed = await self._write_and_bind(
                pod, args, key, uid, annotations, labels, version, kept=None
            )
            if failed is not None:
                return failed
            self._explain_unit(args, uid, gate)
            return "bound", ""
        kept = self.cache.ledger.kept(uid)
        booked = self.scheduler.reserve(request, node, self.cache.ledger, now_ns=self.clock_ns())
        if isinstance(booked, Verdict):
            self._unassume(uid)
            return "unfit", f"pod {key} no longer fits node {args.Node}: {booked.message}"
        dev = node.gpu(booked.indexes[0])
        written = to_annotations(booked, dev_units=dev.mem_units if dev else 0)
        annotations.update(written)
        annotations[ANN_SEAL] = self.cache.trust.seal_for(booked, written[ANN_ALLOCATION]) or None
        failed = await self._write_and_bind(
            pod, args, key, uid, annotations, labels, version, kept=kept
        )
        if failed is not None:
            return failed
        self._explain_bind(args, booked, node)
        self._explain_unit(args, uid, gate)
        log.info(
            "pod=%s node=%s gpu=%s mem=%d phase=bind bound",
            key,
            args.Node,
            ",".join(map(str, booked.indexes)),
            booked.mem_units,
        )
        return "bound", ""

    def _unit_for(self, pod: KubeDict, node: str) -> Gate | tuple[str, str] | None:
        """The ResourcePolicy unit ``node`` places the pod in, or the bind's refusal.

        Checked again here because kube-scheduler binds while it filters the next pod: two
        pods filtered against one free place both pass, and only this check, with the
        assumption that follows it, lets one of them have it.
        """
        book = self.cache.book
        if book is None:
            return None
        gate = book.gate(pod, fitting=[node], now_s=self.clock_ns() / 1e9)
        if gate is None:
            return None
        key = key_of(pod)
        if gate.error:
            return "rejected", f"pod {key}: {gate.error}"
        if not gate.allows(book.node_labels.get(node, {})):
            return "unfit", f"pod {key} may not go to node {node} now: {gate.reason}"
        return gate

    async def _write_and_bind(
        self,
        pod: KubeDict,
        args: ExtenderBindingArgs,
        key: str,
        uid: str,
        annotations: dict[str, str | None],
        labels: dict[str, str],
        version: str,
        *,
        kept: Kept | None,
    ) -> tuple[str, str] | None:
        """Write the annotations and bind; None when bound, else the outcome and error.

        One ``pods/binding`` carries the annotations, at the resourceVersion bind read: the
        API server sets the node and the annotations in one update, or neither. A merge patch
        goes first only for what a binding cannot do: labels (a ResourcePolicy unit's
        ``podLabels``; a binding's labels count only with PodTopologyLabelsAdmission) and
        removing an annotation the pod carries. After an error whose effect is unknown, the
        pod is read again (``_settle``, which decides what to give back); when nothing was
        written, this try's GPU booking is given back here, and ``kept``, the booking the pod
        held before it (``Ledger.kept``), comes back: the 409 may be the earlier binding that
        booked it, landed meanwhile, and its GPUs must stay taken until the watch shows them.
        """
        present = annotations_of(pod)
        patch_first = bool(labels) or any(
            value is None and name in present for name, value in annotations.items()
        )
        carried = {name: value for name, value in annotations.items() if value is not None}
        if patch_first:
            failed = await self._annotate(args, key, uid, annotations, labels, version)
            if failed is not None:
                self.scheduler.unreserve(uid, self.cache.ledger, kept=kept)
                return failed
            carried, version = {}, ""  # written; the patch changed the resourceVersion
        try:
            await self.api.bind_pod(
                args.PodNamespace,
                args.PodName,
                uid,
                args.Node,
                annotations=carried,
                resource_version=version,
            )
        except Conflict as err:
            if not patch_first:  # nothing was written: read it again and start over
                self.scheduler.unreserve(uid, self.cache.ledger, kept=kept)
                self._unassume(uid)
                return "conflict", f"pod {key} changed or was bound while binding: {err}"
            outcome, error = await self._settle(args, key, uid, f"bind {key} to {args.Node}: {err}")
            if outcome not in SUCCESS:
                return outcome, error
        except KubeError as err:
            outcome, error = await self._settle(args, key, uid, f"bind {key} to {args.Node}: {err}")
            if outcome not in SUCCESS:
                return outcome, error
        return None

    def _unassume(self, uid: str) -> None:
        if self.cache.book is not None:
            self.cache.book.unassume(uid)

    async def _annotate(
        self,
        args: ExtenderBindingArgs,
        key: str,
        uid: str,
        annotations: dict[str, str | None],
        labels: dict[str, str],
        version: str,
    ) -> tuple[str, str] | None:
        """Write the bind's annotations and labels; on failure drop the unit assumption."""
        try:
            await self.api.patch_pod_annotations(
                args.PodNamespace,
                args.PodName,
                annotations,
                resource_version=version,
                **({"labels": labels} if labels else {}),
            )
        except Conflict as err:
            self._unassume(uid)
            return "conflict", f"pod {key} kept changing while binding: {err}"
        except KubeError as err:
            self._unassume(uid)
            return "error", f"annotate {key}: {err}"
        return None

    def _already_bound(
        self, pod: KubeDict, args: ExtenderBindingArgs, key: str, request: PodRequest | Rejection
    ) -> tuple[str, str]:
        """A pod the API shows bound: nothing is written, whatever the answer."""
        wants_gpu = isinstance(request, PodRequest) and request.wants_gpu
        reason = already_bound(pod, node=args.Node, wants_gpu=wants_gpu)
        if reason:
            return "error", reason
        log.info("pod=%s node=%s phase=bind already bound there; nothing to do", key, args.Node)
        return "already_bound", ""

    async def _settle(
        self, args: ExtenderBindingArgs, key: str, uid: str, error: str
    ) -> tuple[str, str]:
        """After a failed or unknown binding, read the pod to learn what happened.

        Annotations are removed only from a pod seen unbound, and only at the resourceVersion it
        was seen at; a pod bound meanwhile keeps them (see the module docstring).
        """
        ledger = self.cache.ledger
        for _ in range(self.attempts):
            try:
                pod = await self.api.get_pod(args.PodNamespace, args.PodName)
            except NotFound:
                self.scheduler.unreserve(uid, ledger)
                self._unassume(uid)
                return "error", f"{error}; pod {key} no longer exists"
            except KubeError as err:
                return "error", (
                    f"{error}; cannot read pod {key} to learn whether it is bound ({err}): its "
                    f"annotations and booking stay until the watch shows it"
                )
            seen = uid_of(pod)
            if uid and seen != uid:
                self.scheduler.unreserve(uid, ledger)
                self._unassume(uid)
                return "error", f"{error}; pod {key} was recreated (UID {seen})"
            uid = seen
            bound_to = node_name_of(pod)
            if bound_to == args.Node:
                log.info("pod=%s node=%s phase=bind bound despite: %s", key, args.Node, error)
                return "bound", ""
            if bound_to:
                self.scheduler.unreserve(uid, ledger)
                self._unassume(uid)
                return "error", (
                    f"{error}; pod {key} is bound to node {bound_to}: its annotations are kept"
                )
            self.scheduler.unreserve(uid, ledger)
            self._unassume(uid)
            if not any(name in annotations_of(pod) for name in POD_ANNOTATIONS):
                return "error", error
            version = str(pod.get("metadata", {}).get("resourceVersion", ""))
            try:
                await self.api.patch_pod_annotations(
                    args.PodNamespace,
                    args.PodName,
                    dict.fromkeys(POD_ANNOTATIONS),
                    resource_version=version,
                )
            except Conflict:
                continue  # changed meanwhile, perhaps bound: look again
            except KubeError as err:
                log.warning("pod=%s phase=unreserve cannot clear annotations: %s", key, err)
            return "error", error
        log.warning("pod=%s phase=unreserve pod kept changing; annotations left", key)
        return "error", error
