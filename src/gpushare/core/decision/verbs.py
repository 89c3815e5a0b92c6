"""The extender's verbs as one core call each: ``filter_pod``, ``prioritize_pod`` and
``reserve_bind``, each over the ``ClusterState`` (``core.decision.clusterstate``) and one ask.

kube-scheduler's filter and bind each take several steps in the core: a filter gives back the
intents past their deadline and the pod's own, decides every node, lets a ResourcePolicy keep
only its unit's nodes, and (for most pods of the packing profile) picks the top node and books
its GPUs as the pod's intent; a bind reads the pod's request, checks it is not bound already,
reserves its unit and its GPUs and writes the annotations that say so. Each verb is one call
here that returns one value carrying everything the adapter needs to answer kube-scheduler,
count and tell (``FilterOutcome``, ``PrioritizeOutcome``, ``BindPlan`` or the ``Status`` of a
bind that writes nothing, ``core.model.status``): the adapter converts the wire to these calls
and back, writes to the API and tells, and decides nothing itself.

One rule spans filter and prioritize: a namespace whose pod's intent ran out with no bind
books no intent while that pod is pending (``namespace_stuck``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from gpushare.core.autoscaling.shortfall import Shortfall
from gpushare.core.booking.ledger import Kept, Ledger
from gpushare.core.booking.waiting import Waiting, WaitingPod
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import NamesResult, Scheduler
from gpushare.core.decision.yielding import HOLD_S, NONE, Yielded, give_way
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    key_of,
    name_of,
    namespace_of,
    node_name_of,
    pod_spec_of,
    stored_uid_of,
    uid_of,
)
from gpushare.core.model.names import ANN_ALLOCATION, ANN_SEAL
from gpushare.core.model.requests import PodRequest, Rejection
from gpushare.core.model.status import Code, Status, refused
from gpushare.core.placement.explain import placement_message
from gpushare.core.placement.preferences import stated_preference
from gpushare.core.records.allocation import Allocation, to_annotations
from gpushare.core.records.binding import already_bound
from gpushare.core.resourcepolicies.gating import Gate
from gpushare.core.resourcepolicies.policyplugin import filter_units

MISSING = "node is not in gpushare's cache yet; it will be after the next watch event"


@dataclass(frozen=True, kw_only=True)
class FilterAsk:
    """One filter call: the pod, the nodes asked about, and what the answer may book.

    ``nodes`` holds the inventories of whole node objects (a scheduler without a node cache)
    and ``node_labels`` their labels; without them ``names`` are looked up in the state's
    ``nodes`` (``nodeCacheCapable``), and the labels in its ResourcePolicy book.
    """

    pod: KubeObject
    names: Sequence[str] = ()
    nodes: Sequence[NodeInventory] | None = None
    node_labels: Mapping[str, Mapping[str, str]] | None = None
    now_ns: int
    ttl_ns: int
    """How long an intent booked now lasts (``extender.intents.INTENT_TTL_S``)."""
    unseen_ttl_ns: int
    """How long it lasts while the watch has not shown the pod (``UNSEEN_TTL_S``)."""
    hold_ns: int = int(HOLD_S * 1e9)
    """How long an intent holds against every pod (``core.decision.yielding``)."""
    stuck: Mapping[str, Collection[str]]
    """By namespace, the pods whose intent ran out with no bind: while one of them is still
    pending, the namespace books no intent (``namespace_stuck``)."""
    packing_profile: str


@dataclass(frozen=True)
class Deadline:
    """When an intent booked now runs out (``intent_deadline``)."""

    until_ns: int
    full_ns: int
    """The deadline it gets once the watch shows the pod (``UNSEEN_TTL_S``)."""
    seen: bool
    """Whether the watch has shown the pod unbound."""


def intent_deadline(
    uid: str, pending: Mapping[str, KubeObject], ask: FilterAsk | PrioritizeAsk
) -> Deadline:
    """The deadline of an intent booked at the ask's time: the full one for a pod the watch
    shows unbound, else the short one until it does (a filter for a pod that does not exist
    holds nothing for long)."""
    full = ask.now_ns + ask.ttl_ns
    if uid in pending:
        return Deadline(full, full, seen=True)
    return Deadline(min(full, ask.now_ns + ask.unseen_ttl_ns), full, seen=False)


@dataclass(frozen=True)
class FilterOutcome:
    """Everything a filter decided, booked and gave back, for the adapter to answer and tell."""

    uid: str
    """The pod's UID as stored (empty for a pod not stored yet)."""
    request: PodRequest | Rejection
    passing: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    gated: tuple[str, ...]
    """Fitting nodes the pod's ResourcePolicy refused (their reasons are in failed or
    unresolvable)."""
    top: str
    """The node to book or that was booked (its intent, unless withheld); empty: none."""
    answer: str
    """How the names path answered, the ``gpushare_filter_answers_total`` label: ``top_node``
    or why every node; empty when it was not counted."""
    expired: tuple[str, ...]
    """Intents past their deadline, given back (their GPUs are free again)."""
    dropped: bool
    """Whether the pod's own earlier intent was given back (a new attempt)."""
    deadline: Deadline | None
    """The deadline an intent was asked for with (booked or not); None: none asked for."""
    intent: Allocation | None
    """The intent booked for the pod."""
    withheld: bool
    """Whether an intent was withheld: the pod's namespace holds a stuck pod."""
    yielded: Yielded = NONE
    """Other pods' intents given back because this pod fitted nowhere while they stood
    (``core.decision.yielding``)."""
    scores: Sequence[float] | None = None
    """The raw score of each passing node, in order, when the filter read them on its way
    (``NamesResult.scores``); None when not."""
    deferred: int = 0
    """How many failed nodes wait for another pod to start (``NamesResult.deferred``)."""
    fits: bool = field(init=False)
    """Whether any node passed."""
    one_node: bool = field(init=False)
    """Whether the answer is the top node alone rather than every fitting node."""

    def __post_init__(self) -> None:
        # in the value, so the adapter answers from it without a call back into the core
        object.__setattr__(self, "fits", bool(self.passing))
        object.__setattr__(self, "one_node", bool(self.top) and len(self.passing) > 1)


def filter_pod(
    scheduler: Scheduler, state: ClusterState, ask: FilterAsk, waiting: Waiting
) -> FilterOutcome:
    """A new attempt's filter, whole: see the module docstring. A GPU pod refused on every
    node is remembered in ``waiting`` until GPUs come back; one that fits is forgotten."""
    pod = ask.pod
    uid = stored_uid_of(pod)
    ledger, book = state.ledger, state.book
    expired = tuple(ledger.expire(ask.now_ns))
    dropped = scheduler.drop_intent(uid_of(pod), ledger)
    found = _fits(scheduler, ask, state)
    yielded = NONE
    if not found.passing and isinstance(found.request, PodRequest) and found.request.wants_gpu:
        asked = {n.name for n in ask.nodes} if ask.nodes is not None else set(ask.names)
        yielded = give_way(
            pod,
            uid_of(pod),
            ledger,
            state.pending,
            nodes=asked,
            now_ns=ask.now_ns,
            hold_ns=ask.hold_ns,
        )
        if yielded.booked:
            found = _fits(scheduler, ask, state)
            if not found.passing:
                yielded.restore(ledger)  # no room all the same: nothing changes
                yielded = NONE
    request, fits, failed, unresolvable = (
        found.request,
        found.passing,
        found.failed,
        found.unresolvable,
    )
    scores = found.scores
    passing = fits
    if book is not None:
        labels = (ask.node_labels or {}) if ask.nodes is not None else book.node_labels
        passing = filter_units(
            book, pod, fits, failed, unresolvable, labels, now_s=ask.now_ns / 1e9
        )
    kept = set(passing) if len(passing) < len(fits) else None
    if kept is not None:
        scores = None  # a ResourcePolicy left some out: they no longer line up
    gated = tuple(n for n in fits if n not in kept) if kept is not None else ()
    if passing or not isinstance(request, PodRequest) or not request.wants_gpu:
        waiting.forget(uid)
    elif uid:
        waiting.refused(WaitingPod(uid, namespace_of(pod), name_of(pod)))
    if fits or not isinstance(request, PodRequest) or not request.wants_gpu:
        state.shortfalls.forget(uid)
    elif uid:
        state.shortfalls.refused(_shortfall(pod, uid, ask, state, failed))
    outcome = FilterOutcome(
        uid=uid,
        request=request,
        passing=passing,
        failed=failed,
        unresolvable=unresolvable,
        gated=gated,
        top="",
        answer="",
        expired=expired,
        dropped=dropped,
        deadline=None,
        intent=None,
        withheld=False,
        yielded=yielded,
        scores=scores,
        deferred=found.deferred,
    )
    if ask.nodes is not None:
        return outcome
    return _top_only(scheduler, ask, state, outcome)


def _shortfall(
    pod: KubeObject, uid: str, ask: FilterAsk, state: ClusterState, failed: Mapping[str, str]
) -> Shortfall:
    """What the autoscalers' placeholders need of a refusal on every node
    (``core.autoscaling``): the largest GPU among the nodes short of room, the newest node."""
    inventories = {n.name: n for n in ask.nodes} if ask.nodes is not None else state.nodes
    asked = [n.name for n in ask.nodes] if ask.nodes is not None else ask.names
    gpu_mib = 0
    for name in failed:
        node = inventories.get(name)
        if node is not None:
            for gpu in node.gpus:
                if gpu.in_service:
                    gpu_mib = max(gpu_mib, gpu.mem_units * node.unit.mib)
    created = state.node_created
    return Shortfall(
        uid=uid,
        namespace=namespace_of(pod),
        name=name_of(pod),
        gpu_mib=gpu_mib,
        newest_node_s=max((created.get(n, 0.0) for n in asked), default=0.0),
        since_ns=ask.now_ns,
    )


def _fits(scheduler: Scheduler, ask: FilterAsk, state: ClusterState) -> NamesResult:
    """Every node asked about, decided against the ledger as it stands, before the pod's
    ResourcePolicy; a name not in the state's nodes fails as ``MISSING``."""
    pod, ledger = ask.pod, state.ledger
    if ask.nodes is not None:
        result = scheduler.filter(pod, ask.nodes, ledger, cluster=state.nodes)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        fits: list[str] = []
        deferred = 0
        for verdict in result.verdicts:
            status = verdict.status
            if status.is_success:
                fits.append(verdict.node)
            elif status.may_pass_later:
                failed[verdict.node] = status.message
                deferred += status.code is Code.WAIT
            else:
                unresolvable[verdict.node] = status.message
        return NamesResult(
            result.request, sorted(set(fits)), failed, unresolvable, [], None, deferred
        )
    names = scheduler.filter_names(pod, list(ask.names), state.nodes, ledger)
    if not names.missing:
        return names
    failed = dict(names.failed)
    for name in names.missing:
        failed[name] = MISSING
    return replace(names, failed=failed)


def _top_only(
    scheduler: Scheduler, ask: FilterAsk, state: ClusterState, outcome: FilterOutcome
) -> FilterOutcome:
    """The one node to answer the filter with, its GPUs booked as the pod's intent.

    kube-scheduler takes a lone feasible node without scoring or calling prioritize
    (``schedulePod``, pkg/scheduler/schedule_one.go), which saves a round trip and its score
    plugins per pod. It would have taken the extender's top node anyway when the pod is in the
    packing profile and nothing kube-scheduler still scores there differs between nodes
    (``core.placement.preferences``). When only one node fits it has no choice either: the
    answer stays as it is, and this books the intent prioritize would have. With the top node
    alone the other nodes' reasons are left out: kube-scheduler reads them only when no node is
    left. With every node, prioritize books the intent.
    """
    request, passing = outcome.request, outcome.passing
    if not passing or not isinstance(request, PodRequest) or not request.wants_gpu:
        return outcome
    table, ledger = state.nodes, state.ledger
    why = _why_every_node(ask, state, passing) if len(passing) > 1 else ""
    if why:
        return _with(outcome, answer=why)
    name = scheduler.top_name(request, passing, table, ledger, scores=outcome.scores)
    if name and namespace_stuck(
        namespace_of(ask.pod), ask.stuck, state.pending, expired=outcome.expired
    ):
        return _with(outcome, top=name, answer="top_node", withheld=True)
    deadline = intent_deadline(outcome.uid, state.pending, ask)
    intent = scheduler.intend_on(
        request,
        name,
        table,
        ledger,
        until_ns=deadline.until_ns,
        booked_ns=ask.now_ns,
        cluster=table,
    )
    if intent is None:
        return _with(outcome, answer="no_score", deadline=deadline)
    return _with(outcome, top=intent.node, answer="top_node", deadline=deadline, intent=intent)


def _with(
    outcome: FilterOutcome,
    *,
    top: str = "",
    answer: str,
    deadline: Deadline | None = None,
    intent: Allocation | None = None,
    withheld: bool = False,
) -> FilterOutcome:
    return replace(
        outcome,
        top=top,
        answer=answer,
        deadline=deadline,
        intent=intent,
        withheld=withheld,
    )


def namespace_stuck(
    namespace: str,
    stuck: Mapping[str, Collection[str]],
    pending: Mapping[str, KubeObject],
    *,
    expired: Sequence[str] = (),
) -> bool:
    """Whether the namespace books no intent: it holds a pending pod whose intent ran out with
    no bind (``stuck``, by namespace), before this call or in it (``expired``).

    Such a pod waits past PreBind or Permit (a volume never provisioned, say), and a pod of
    the same tenant created next would most likely wait the same way: its intent would only
    hold GPUs from everyone else for another 30 s. Without one nothing is refused, the pod only
    loses the protection from a race at bind, which checks the node again.
    """
    if any(uid in pending for uid in stuck.get(namespace, ())):
        return True
    return any(uid in pending and namespace_of(pending[uid]) == namespace for uid in expired)


def _why_every_node(ask: FilterAsk, state: ClusterState, passing: list[str]) -> str:
    """Why kube-scheduler's own scores may prefer another fitting node; empty if not."""
    pod = ask.pod
    if pod_spec_of(pod).get("schedulerName") != ask.packing_profile:
        return "other_profile"
    if stated_preference(pod):
        return "stated_preference"
    if state.placed_terms.matching(pod):
        return "placed_affinity"
    tainted = state.soft_tainted
    if tainted and any(name in tainted for name in passing):
        return "prefer_no_schedule_taint"
    return ""


@dataclass(frozen=True, kw_only=True)
class PrioritizeAsk:
    """One prioritize call: the pod, the nodes asked about, and how long its intent lasts.

    ``nodes`` holds the inventories of whole node objects (a scheduler without a node cache);
    without them ``names`` are looked up in the state's ``nodes``, and unknown ones left out.
    """

    pod: KubeObject
    names: Sequence[str] = ()
    nodes: Sequence[NodeInventory] | None = None
    now_ns: int
    ttl_ns: int
    unseen_ttl_ns: int
    stuck: Mapping[str, Collection[str]]
    """By namespace, the pods whose intent ran out with no bind (``namespace_stuck``)."""


@dataclass(frozen=True)
class PrioritizeOutcome:
    """The scores a prioritize answers with, and the intent it booked or withheld."""

    uid: str
    """The pod's UID as stored (empty for a pod not stored yet)."""
    names: list[str]
    scores: list[int]
    """0..10 for each of ``names``, in order."""
    withheld: bool
    """Whether an intent was withheld (and the pod's earlier one given back): the pod's
    namespace holds a stuck pod."""
    deadline: Deadline | None
    """The deadline an intent was asked for with (booked or not); None: none asked for."""
    intent: Allocation | None
    """The intent booked on the top node; None: none (no GPU asked, no node fits, withheld)."""
    namespace: str = ""
    """The pod's namespace (whose stuck pods the adapter looks at again)."""


def prioritize_pod(
    scheduler: Scheduler, state: ClusterState, ask: PrioritizeAsk
) -> PrioritizeOutcome:
    """Score the nodes asked about and book the top node's GPUs as the pod's intent until its
    bind comes (``Scheduler.intend``), unless its namespace holds a stuck pod."""
    pod, ledger = ask.pod, state.ledger
    nodes: Mapping[str, NodeInventory]
    if ask.nodes is None:
        nodes = state.nodes
        names = list(filter(nodes.__contains__, ask.names))
        scores = scheduler.prioritize_names(pod, names, nodes, ledger)
    else:
        by_name = scheduler.prioritize(pod, ask.nodes, ledger, cluster=state.nodes)
        names = [n.name for n in ask.nodes]
        scores = [by_name.get(name, 0) for name in names]
        nodes = {n.name: n for n in ask.nodes}
    uid = stored_uid_of(pod)
    if namespace_stuck(namespace_of(pod), ask.stuck, state.pending):
        scheduler.drop_intent(uid_of(pod), ledger)
        return PrioritizeOutcome(
            uid,
            names,
            scores,
            withheld=True,
            deadline=None,
            intent=None,
            namespace=namespace_of(pod),
        )
    deadline = intent_deadline(uid, state.pending, ask)
    intent = scheduler.intend(
        pod,
        names,
        scores,
        nodes,
        ledger,
        until_ns=deadline.until_ns,
        booked_ns=ask.now_ns,
        cluster=state.nodes,
    )
    return PrioritizeOutcome(
        uid,
        names,
        scores,
        withheld=False,
        deadline=deadline,
        intent=intent,
        namespace=namespace_of(pod),
    )


class BindOutcome(Enum):
    """How one try of a bind ended, as its ``Status`` counts (``BIND_OUTCOMES``); the value is
    the ``gpushare_binds_total`` outcome label."""

    BOUND = "bound"
    ALREADY_BOUND = "already_bound"
    """The API already showed the pod bound there, with its allocation: nothing written."""
    CONFLICT = "conflict"
    """The pod changed, or was bound, while binding (a 409): nothing written, try again."""
    UNFIT = "unfit"
    """The pod no longer fits the node, or its ResourcePolicy unit is closed there now."""
    REJECTED = "rejected"
    """The pod's request, or its ResourcePolicy, is invalid."""
    ERROR = "error"


SUCCEEDED: frozenset[BindOutcome] = frozenset((BindOutcome.BOUND, BindOutcome.ALREADY_BOUND))
"""The outcomes kube-scheduler is answered with success for."""
DECIDED_FROM_THE_COPY: frozenset[BindOutcome] = frozenset(
    (BindOutcome.CONFLICT, BindOutcome.UNFIT, BindOutcome.REJECTED)
)
"""The outcomes reached with nothing written: from the watch's copy of the pod, bind checks it
again on a fresh read. Errors are not among them: after a write whose effect is unknown the
booking must stay as the adapter's settling left it. (Sets, like ``BIND_OUTCOMES``, so the
adapter looks an outcome up without a call into the core.)"""


BIND_OUTCOMES: Mapping[Code, BindOutcome] = {
    Code.SUCCESS: BindOutcome.BOUND,
    Code.SKIP: BindOutcome.ALREADY_BOUND,
    Code.CONFLICT: BindOutcome.CONFLICT,
    Code.UNSCHEDULABLE: BindOutcome.UNFIT,
    Code.UNRESOLVABLE: BindOutcome.UNFIT,
    Code.WAIT: BindOutcome.UNFIT,
    Code.INVALID: BindOutcome.REJECTED,
    Code.ERROR: BindOutcome.ERROR,
}
"""The outcome a bind try's status counts as, by its code: unfit for every refusal on the
node, rejected for an invalid pod or policy (a table, so the adapter looks it up without a
call into the core)."""

BIND = "bind"
"""Who the statuses of a bind's own steps say decided."""
BOUND = Status(source=BIND)
"""A bind try that bound the pod."""


@dataclass(frozen=True)
class BindPlan:
    """A bind reserved in every booking store: what to write on the pod, and what to tell."""

    uid: str
    node: NodeInventory
    gate: Gate | None
    """The pod's ResourcePolicy decision (None: no policy orders it)."""
    allocation: Allocation | None
    """The GPUs booked (None: the pod asks for none)."""
    kept: Kept | None
    """The booking the pod held before this one (an earlier bind's, outcome unknown): it comes
    back if this try is given back."""
    annotations: dict[str, str | None]
    """The annotations to write (None: remove it)."""
    labels: dict[str, str]
    version: str
    """The resourceVersion the writes are guarded by."""
    patch_first: bool
    """Whether a merge patch must go before the binding: labels, or the removal of an
    annotation the pod carries (a binding can do neither)."""
    carried: dict[str, str]
    """The annotations the ``pods/binding`` carries."""
    placed: str = ""
    """The Event message that says where the pod went and how full its GPUs are with it
    (``placement_message``); empty when it books no GPU."""
    gpus: str = ""
    """The booked GPUs' indexes, comma-separated, for the log line of the bind."""
    mem_units: int = 0
    """The memory units booked, for the log line of the bind."""


def copy_will_do(ledger: Ledger, uid: str) -> bool:
    """Whether a bind may start from the watch's copy of the pod: only while the pod holds
    nothing or its intent. A booking kept from an earlier bind whose outcome was unknown (the
    API server stalled) must meet the pod as it is now, not as the watch, stalled with it,
    last showed it."""
    return ledger.holding(uid) is None or ledger.intent_until(uid) is not None


@dataclass(frozen=True, kw_only=True)
class BindAsk:
    """One bind try: the pod as read (or watched), the node, and the UID kube-scheduler
    asked for (empty: any)."""

    pod: KubeObject
    node: str
    asked_uid: str
    now_ns: int


def reserve_bind(scheduler: Scheduler, state: ClusterState, ask: BindAsk) -> BindPlan | Status:
    """One bind try's decision over the pod as read (or watched): the plan it writes, every
    store reserved (``Scheduler.reserve_pod``); or the status when it writes nothing."""
    pod, node, asked_uid = ask.pod, ask.node, ask.asked_uid
    ledger, trust = state.ledger, state.trust
    key = key_of(pod)
    uid = stored_uid_of(pod)
    if asked_uid and uid != asked_uid:
        return refused(
            Code.ERROR,
            f"pod {key} was recreated (UID {uid}, scheduler asked for {asked_uid})",
            BIND,
        )
    request = scheduler.read(pod)
    if node_name_of(pod):
        wants_gpu = isinstance(request, PodRequest) and request.wants_gpu
        return already_bound(pod, node=node, wants_gpu=wants_gpu)
    if isinstance(request, Rejection):
        return refused(Code.INVALID, f"pod {key}: {request.message}", BIND)
    inventory = state.nodes.get(node)
    if inventory is None:
        return refused(Code.ERROR, f"node {node} is not in gpushare's cache", BIND)
    kept = ledger.kept(uid) if request.wants_gpu else None
    # checked again here because kube-scheduler binds while it filters the next pod
    reserved = scheduler.reserve_pod(
        pod, request, inventory, ledger, book=state.book, cluster=state.nodes, now_ns=ask.now_ns
    )
    if not reserved.status.ok:
        return reserved.status
    annotations, labels = dict(reserved.unit.annotations), dict(reserved.unit.labels)
    booked = reserved.allocation
    if booked is not None:
        dev = inventory.gpu(booked.indexes[0])
        written = to_annotations(booked, dev_units=dev.mem_units if dev else 0)
        annotations.update(written)
        annotations[ANN_SEAL] = trust.seal_for(booked, written[ANN_ALLOCATION]) or None
    placed, gpus, mem_units = "", "", 0
    if booked is not None:
        placed = placement_message(booked, inventory, ledger.usage(inventory.name))
        gpus, mem_units = ",".join(map(str, booked.indexes)), booked.mem_units
    present = annotations_of(pod)
    patch_first = bool(labels) or any(
        value is None and name in present for name, value in annotations.items()
    )
    return BindPlan(
        uid=uid,
        node=inventory,
        gate=reserved.unit.gate,
        allocation=booked,
        kept=kept,
        annotations=annotations,
        labels=labels,
        version=str(pod.get("metadata", {}).get("resourceVersion", "")),
        patch_first=patch_first,
        carried={name: value for name, value in annotations.items() if value is not None},
        placed=placed,
        gpus=gpus,
        mem_units=mem_units,
    )
