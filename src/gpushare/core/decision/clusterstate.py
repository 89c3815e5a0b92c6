"""The cluster as the decisions see it: one owner for everything the watches bring in.

The extender's cache (``kube.cache``), the simulator and ``kubectl inspect cgpu`` each keep
nodes and pods; what the core decides over is the same every time, so it is kept in one
object here: the node inventories (``nodes``), the ledger of what is held on each node and
by whom (``ledger``, judged by ``trust``), the pods not bound yet (``pending``), the placed
pods' scoring terms (``placed_terms``), the nodes with a ``PreferNoSchedule`` taint
(``soft_tainted``), the ResourcePolicy book (``book``), the workload the fragmentation-aware
policies learn from (``workload``), and for the autoscalers (``core.autoscaling``) the GPU pods
refused on every node (``shortfalls``), each node's creation time (``node_created``) and the
nodes gpushare guards from scale-down (``guarded``). All of it is given at construction;
nothing is wired in later.

Whoever watches the API hands each node and pod to ``apply_node`` and ``apply_pod`` (or a
whole list to ``relist``), and gets back what changed (``NodeTaken``, ``PodTaken``,
``Relisted``): an allocation ignored and whether to say so, a pod that failed, GPU share given
back. The adapter acts on those values (counts, Events, retries); the state calls nobody.
This is kube-scheduler's ``pkg/scheduler/backend/cache`` split the same way: the decisions see
the state, never the informers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Literal

from gpushare.core.autoscaling.placeholders import PLACEHOLDER_LABEL, created_seconds
from gpushare.core.autoscaling.scaledown import ANN_GUARD
from gpushare.core.autoscaling.shortfall import Shortfalls
from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger, is_terminal
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    labels_of,
    name_of,
    node_name_of,
    stored_uid_of,
    uid_of,
)
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.placement.defragmenting import WorkloadFeed
from gpushare.core.placement.preferences import PlacedTerms, has_prefer_no_schedule_taint
from gpushare.core.records.trust import Ignored, IgnoredOnce, Judged, Trust
from gpushare.core.resourcepolicies.gating import Placed
from gpushare.core.resourcepolicies.policybook import PolicyBook, placing_of

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
"""What a watch says happened to an object (a bookmark changes nothing)."""

ApiObject = dict[str, Any]
"""A node or pod object as the API server's JSON (``kube.port.KubeDict``)."""


class NodeChange(Enum):
    """What a node event did to ``ClusterState.nodes``."""

    ADDED = "added"
    CHANGED = "changed"
    REMOVED = "removed"
    NONE = "none"
    """An event type that changes nothing (a bookmark)."""


@dataclass(frozen=True)
class NodeTaken:
    """What one node event changed."""

    name: str
    change: NodeChange


@dataclass(frozen=True)
class PodTaken:
    """What one pod event (or one listed pod) changed, for the adapter to act on."""

    pod: ApiObject
    ignored: Ignored | None = None
    """An allocation the ledger did not take, to report: only the first time this pod is
    ignored for this reason (a relist does not report it again); None: nothing to report."""
    first: bool = False
    """Whether ``ignored`` is the first report of this pod at all (one Event per UID)."""
    failed: bool = False
    """Whether the pod is in phase Failed (``core.records.readmission``)."""
    freed: bool = False
    """Whether the pod gave back the GPU share it held (deleted, finished, its intent gone
    with it): pods refused just before may fit now."""
    deleted: bool = False
    """Whether this was the pod's deletion (the object is its last state, gates and all)."""


@dataclass(frozen=True)
class Relisted:
    """A relist replaced the whole state. It may have missed a pod that gave its share back,
    so it counts as GPU share freed."""

    nodes: int
    pods: int


class ClusterState:
    """Nodes, pods and what they hold, as every decision reads them.

    A pod's states, as the state tracks them (the ledger holds the booking in each)::

                  filter or            bind                 the watch shows
                  prioritize           reserves             it bound
        pending ------------> intended ---------> assumed -----------------> confirmed
           ^                    |                   |                           |
           | deadline passed,   |                   | deleted, finished, or     |
           +--------------------+                   | gone from a relist        |
             filtered again,                        v                           |
             bind failed                           gone <-----------------------+
                                          (``PodTaken.freed``)

        pending:   unbound and unfinished, kept in ``pending`` as last watched;
        intended:  its GPUs booked until a deadline (``Ledger.intend``);
        assumed:   booked at bind (``Ledger.assume``), kept over a relist while the pod exists;
        confirmed: read from its sealed annotations (``Ledger.observe``);
        ignored:   bound with an allocation ``trust`` does not take: holds nothing, reported
                   once per reason (``PodTaken.ignored``).

    ``pending`` holds the unbound live pods as last listed or watched (``pending_store`` makes
    the mapping: the extender keeps them serialised, ``kube.pendingpods``); the intents and
    bookings live in the ledger, whose owner is this state.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        trust: Trust,
        workload: WorkloadFeed | None = None,
        book: PolicyBook | None = None,
        pending_store: Callable[[], MutableMapping[str, ApiObject]] = dict,
    ) -> None:
        self.settings = settings
        self.trust = trust
        """How allocations are judged; the extender seals its own with the same key."""
        self.workload = workload
        """Counts each GPU pod once: the fragmentation-aware policies learn the workload."""
        self.book = book
        """Placed pods and node labels for ResourcePolicy decisions (fed here too)."""
        self._pending_store = pending_store
        self._reported = IgnoredOnce()
        self.nodes = NodeTable()
        self.ledger = self._new_ledger()
        self.pending: MutableMapping[str, ApiObject] = pending_store()
        """Unbound, unfinished pods by UID, as last listed or watched."""
        self.placed_terms = PlacedTerms()
        """ApiObject-affinity terms of placed pods that score nodes for other pods."""
        self.soft_tainted: set[str] = set()
        """Nodes with a ``PreferNoSchedule`` taint."""
        self.shortfalls = Shortfalls()
        """GPU pods the filter refused on every node it was asked about."""
        self.node_created: dict[str, float] = {}
        """Each node's ``creationTimestamp`` in seconds (the API server's clock)."""
        self.guarded: dict[str, str] = {}
        """Nodes carrying gpushare's scale-down guard marker, with its value."""
        self.placeholders: dict[str, ApiObject] = {}
        """Pods labelled as gpushare's placeholders, by UID, so the autoscaling loop finds
        them without reading every pending pod."""

    @classmethod
    def listed(
        cls,
        *,
        settings: Settings,
        trust: Trust,
        nodes: Iterable[NodeInventory],
        pods: Iterable[KubeObject] = (),
    ) -> ClusterState:
        """The state one list gives, with nothing watched after: the nodes as read and the
        ledger rebuilt from the pods' annotations (``Ledger.observe``). ``kubectl inspect cgpu
        --explain`` and the simulator start from it."""
        state = cls(settings=settings, trust=trust)
        for node in nodes:
            state.nodes[node.name] = node
        for pod in pods:
            state.ledger.observe(pod)
        return state

    def _new_ledger(self, judged: Judged | None = None) -> Ledger:
        names, unit = self.settings.names, self.settings.unit
        if judged is not None:
            return Ledger(names=names, unit=unit, judged=judged)
        return Ledger(names=names, unit=unit, trust=self.trust)

    def _read(self, node: ApiObject) -> NodeInventory:
        return read_node(node, cluster_unit=self.settings.unit, names=self.settings.names)

    def _observe(self, ledger: Ledger, pod: ApiObject) -> PodTaken:
        """Book the pod's allocation, if trusted; what to report about it."""
        failed = (pod.get("status") or {}).get("phase") == "Failed"
        why = ledger.observe(pod)
        if why is not None:
            report = self._reported.note(uid_of(pod), why.reason)
            if report.count:
                return PodTaken(pod, ignored=why, first=report.tell, failed=failed)
        return PodTaken(pod, failed=failed)

    @staticmethod
    def _track(pending: MutableMapping[str, ApiObject], pod: ApiObject) -> None:
        """Keep an unbound live pod in ``pending``; drop it once bound or finished."""
        uid = stored_uid_of(pod)
        if not uid:
            return
        if node_name_of(pod) or is_terminal(pod):
            pending.pop(uid, None)
        else:
            pending[uid] = pod

    def books(self, uid: str) -> bool:
        """Whether the ledger holds a bind's booking or an intent for the pod."""
        return self.ledger.kept(uid) is not None or self.ledger.intent_until(uid) is not None

    def apply_node(self, event: EventType, node: ApiObject) -> NodeTaken:
        """Take in one node event (the node's shape checked already)."""
        name = name_of(node)
        if event == "DELETED":
            self.nodes.pop(name, None)
            self.soft_tainted.discard(name)
            self.node_created.pop(name, None)
            self.guarded.pop(name, None)
            if self.book is not None:
                self.book.forget_node(name)
            return NodeTaken(name, NodeChange.REMOVED)
        if event not in ("ADDED", "MODIFIED"):
            return NodeTaken(name, NodeChange.NONE)
        change = NodeChange.CHANGED if name in self.nodes else NodeChange.ADDED
        self.nodes[name] = self._read(node)
        self.node_created[name] = created_seconds(node)
        _note_guard(self.guarded, node)
        if has_prefer_no_schedule_taint(node):
            self.soft_tainted.add(name)
        else:
            self.soft_tainted.discard(name)
        if self.book is not None:
            self.book.observe_node(node)
        return NodeTaken(name, change)

    def apply_pod(self, event: EventType, pod: ApiObject) -> PodTaken:
        """Take in one pod event (the pod's shape checked already)."""
        uid = uid_of(pod)
        held = bool(self.ledger.nodes_held_by(uid))
        taken = PodTaken(pod, deleted=event == "DELETED")
        if event == "DELETED":
            self.pending.pop(stored_uid_of(pod), None)
            self.shortfalls.forget(stored_uid_of(pod))
            self.placeholders.pop(stored_uid_of(pod), None)
            self.placed_terms.forget(uid)
            self.ledger.forget(uid)
            self._reported.forget(uid)
            if self.workload is not None:
                self.workload.forget(uid)
            if self.book is not None:
                self.book.forget_pod(uid)
        elif event in ("ADDED", "MODIFIED"):
            self._track(self.pending, pod)
            if node_name_of(pod) or is_terminal(pod):
                self.shortfalls.forget(stored_uid_of(pod))
            _note_placeholder(self.placeholders, pod)
            self.placed_terms.observe(pod)
            taken = self._observe(self.ledger, pod)
            if self.book is not None:
                self.book.observe_pod(pod)
            if self.workload is not None:
                self.workload.observe(pod)
        if held and not self.ledger.nodes_held_by(uid):
            return replace(taken, freed=True)
        return taken

    def relist(self, nodes: Iterable[ApiObject]) -> Relist:
        """Start a relist from the listed nodes (shapes checked): feed it the listed pods,
        then ``Relist.finish`` replaces the state at once."""
        return Relist(self, nodes)


def _note_placeholder(placeholders: dict[str, ApiObject], pod: ApiObject) -> None:
    uid = stored_uid_of(pod)
    if uid and labels_of(pod).get(PLACEHOLDER_LABEL) == "true" and not is_terminal(pod):
        placeholders[uid] = pod
    else:
        placeholders.pop(uid, None)


def _note_guard(guarded: dict[str, str], node: ApiObject) -> None:
    marker = annotations_of(node).get(ANN_GUARD)
    if marker is None:
        guarded.pop(name_of(node), None)
    else:
        guarded[name_of(node)] = marker


class Relist:
    """A new state being built from a list, one page of pods at a time.

    Until ``finish`` every decision reads the state as it was; the pods' pages pass through
    ``take`` and no pod object outlives its page (only what the decisions read is kept).
    """

    def __init__(self, state: ClusterState, listed_nodes: Iterable[ApiObject]) -> None:
        self.state = state
        nodes = list(listed_nodes)
        self.table = NodeTable((name_of(n), state._read(n)) for n in nodes)
        self.soft_tainted = {name_of(n) for n in nodes if has_prefer_no_schedule_taint(n)}
        self.node_created = {name_of(n): created_seconds(n) for n in nodes}
        self.guarded: dict[str, str] = {}
        for n in nodes:
            _note_guard(self.guarded, n)
        self.node_labels: dict[str, Mapping[str, str]] = {
            name_of(n): dict(labels_of(n)) for n in nodes
        }
        # what is read of the nodes is taken before the pods come, and the objects go: as
        # listed, 5,000 nodes are about 32 MiB, which the pods' new state would come on top of
        del nodes
        self.ledger = state._new_ledger(state.ledger.judged)  # unchanged pods' judgements stand
        self.pending = state._pending_store()
        self.placed_terms = PlacedTerms()
        self.placeholders: dict[str, ApiObject] = {}
        self.listed: set[str] = set()
        self.alive: set[str] = set()
        self.kept: dict[str, ApiObject] = {}
        """Bound pods that hold a booking: read again once the bookings are in (unbound ones
        are read again from ``pending``)."""
        self.counted: list[tuple[str, PodRequest]] = []
        self.placings: list[tuple[str, Placed | None, bool]] = []
        self.pods = 0

    def take(self, pod: ApiObject) -> PodTaken:
        """Take in one listed pod (its shape checked)."""
        state = self.state
        self.pods += 1
        uid = uid_of(pod)
        self.listed.add(uid)
        if not is_terminal(pod):
            self.alive.add(uid)
        taken = state._observe(self.ledger, pod)
        state._track(self.pending, pod)
        _note_placeholder(self.placeholders, pod)
        if node_name_of(pod) and state.books(uid):
            self.kept[uid] = pod
        self.placed_terms.observe(pod)
        workload = state.workload
        if workload is not None and not workload.counted(uid):
            request = read_pod(pod, names=workload.names, unit=workload.unit)
            if isinstance(request, PodRequest):
                self.counted.append((uid, request))
        if state.book is not None:
            self.placings.append(placing_of(pod))
        return taken

    def finish(self) -> Relisted:
        """Replace the state with what was listed. Bind-time bookings survive while their
        pods still exist (they may not show their annotations yet); one whose pod vanished or
        finished while nobody watched is dropped."""
        state, ledger, alive = self.state, self.ledger, self.alive
        old = state.ledger
        ledger.judged.retain(alive)
        state._reported.retain(alive)
        for assumed in old.assumptions():
            if assumed.uid in alive:  # a pod deleted while we were not watching frees it
                host = old.host_of(assumed.uid)
                until = old.intent_until(assumed.uid)
                if until is None:
                    ledger.assume(assumed, host)
                else:  # an intent stays one, with its deadline
                    booked = old.intent_booked(assumed.uid)
                    ledger.intend(assumed, host, until_ns=until, booked_ns=booked)
                seen = self.kept.get(assumed.uid) or self.pending.get(assumed.uid)
                if seen is not None:  # seen with the booking's placement, it ends the booking
                    ledger.observe(seen)
        if state.workload is not None:
            state.workload.retain(self.listed)
            for uid, request in self.counted:
                state.workload.count(uid, request)
        if state.book is not None:
            state.book.replace_node_labels(self.node_labels)
            state.book.retain_pods(alive)
            for uid, placed, terminal in self.placings:
                state.book.take_pod(uid, placed, terminal=terminal)
        state.nodes = self.table
        state.soft_tainted = self.soft_tainted
        state.node_created = self.node_created
        state.guarded = self.guarded
        state.shortfalls.retain(self.pending.keys())
        state.placeholders = self.placeholders
        state.placed_terms = self.placed_terms
        state.ledger = ledger
        state.pending = self.pending
        return Relisted(nodes=len(self.table), pods=self.pods)
