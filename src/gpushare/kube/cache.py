"""The extender's view of the cluster: a list-then-watch cache of nodes and pods.

It lists both kinds, rebuilds the ledger from pod annotations (so a restart loses nothing), and
then follows both watches from the lists' resourceVersions. A ``Gone`` (410) leads to a fresh list
at once; any other failure, of the list or of a watch, to a fresh list after a wait that grows
with each failure in a row (kube.backoff), so a down API server is not asked for every node and
pod every second. A watch event proves the server answers and starts the count over.

Bind-time assumptions survive a relist while their pods still exist, because those pods may not
show their annotations yet; an assumption whose pod vanished or finished while the watch was
down is dropped.

``synced`` stays False until the first full list, and ``/readyz`` reports it. Each list's and
watch's outcome also goes to ``health`` (kube.watchhealth), so that a watch the API server
refuses (RBAC) makes ``/readyz`` fail with the verb to grant, even after the lists went through.

**Memory.** Pods are listed a page at a time (``list_pod_pages``) and each page is read into
the new state before the next is fetched; no pod object outlives its page. What stays per pod
is what the decisions read: its booking and host requests in the ledger, its judgement, its
placement for ResourcePolicies, its scoring terms, and for a pod not yet bound the fields the
core reads of it, serialised (``kube.pendingpods``).
The API port hands over objects as the server's JSON without what no reader here reads
(``managedFields``, condition lists, a node's images: ``kube.lightkube_api``).

**One bad object never ends the watch.** Each node and pod passes ``core.model.shape`` before
anything
reads it, the boundary the extender's wire and the webhook use too; one that does not is skipped
(its last good version stays) and reported to ``on_skipped``, which the extender logs and counts.
The annotations and labels inside are strings whose readers turn any value into a reason, never
an exception. Should a reader still raise, the event is skipped and reported the same way rather
than ending the watch, and a failure of a whole list is kept in ``problem`` (``/readyz`` then
says the cache is not ready, and why) until a list succeeds again.

Every pod is judged as it comes in (core.records.trust): the ledger takes only allocations gpushare
sealed for that pod, once per pod version, so the filter never pays for it. An ignored one is
reported to ``on_ignored`` once per pod and reason (a relist does not count it again), with a
flag for the first report of that pod (the extender's metrics and Events use both).

Unbound live pods are kept as the watch last showed them (``pending``, by UID, what the core
reads of them), so bind can start from the API's own copy instead of reading the pod again;
the resourceVersion it carries guards the write, and a copy the watch has not caught up with
only costs a 409 and a read.

It also keeps what kube-scheduler's remaining score plugins weigh beyond the pod itself
(``core.placement.preferences``): the pod-affinity terms of placed pods (``placed_terms``) and the
nodes
with a ``PreferNoSchedule`` taint (``soft_tainted``).

Every pod listed or watched is also handed to the ``workload`` feed, which counts each pod with
a GPU request once (by UID): the fragmentation-aware policies learn the workload from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import msgspec

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger, is_terminal
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.kubejson import (
    TERMINAL_PHASES,
    KubeObject,
    labels_of,
    name_of,
    node_name_of,
    stored_uid_of,
    uid_of,
)
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.shape import node_shape, pod_shape
from gpushare.core.placement.defragmenting import WorkloadFeed
from gpushare.core.placement.preferences import PlacedTerms, has_prefer_no_schedule_taint
from gpushare.core.records.trust import Ignored, IgnoredOnce, Judged, Trust
from gpushare.core.resourcepolicies.gating import Placed
from gpushare.core.resourcepolicies.policybook import PolicyBook, placing_of
from gpushare.kube.backoff import Backoff
from gpushare.kube.pendingpods import PendingPods
from gpushare.kube.port import Gone, KubeAPI, KubeDict, KubeError, WatchEvent
from gpushare.kube.sealing import keyless_trust
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)


class OnIgnored(Protocol):
    """Told about an ignored allocation: once per pod and reason, ``first`` once per pod."""

    def __call__(self, pod: KubeObject, why: Ignored, *, first: bool) -> None: ...


class OnSkipped(Protocol):
    """Told about a watched or listed object the cache could not take in, and why."""

    def __call__(self, kind: str, obj: KubeDict, why: str) -> None: ...


class ClusterCache:
    """Node inventories and the ledger, kept current from the API."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        settings: Settings,
        on_change: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        workload: WorkloadFeed | None = None,
        trust: Trust | None = None,
        on_ignored: OnIgnored | None = None,
        book: PolicyBook | None = None,
        on_skipped: OnSkipped | None = None,
        on_failed: Callable[[KubeDict], None] | None = None,
        on_freed: Callable[[], None] | None = None,
        health: WatchHealth | None = None,
    ) -> None:
        self._api = api
        self.health = health if health is not None else WatchHealth(role="its ClusterRole")
        """Where a refused list or watch is reported (kube.watchhealth); ``/readyz`` reads it."""
        self._settings = settings
        self._on_change = on_change
        self.backoff = backoff if backoff is not None else Backoff()
        """Waits between failed lists and watches."""
        self._sleep = sleep
        self.workload = workload
        self.trust = trust if trust is not None else keyless_trust(api)
        """How allocations are judged; the extender seals its own with the same key."""
        self.on_ignored = on_ignored
        self.book = book
        """Placed pods and node labels for ResourcePolicy decisions (fed here too)."""
        self._reported = IgnoredOnce()
        self._digests: dict[str, int] = {}
        """What was last taken in of recently watched bound pods, by UID (``_digest``)."""
        self.nodes = NodeTable()
        self.ledger = self._new_ledger()
        self.pending = PendingPods()
        """Unbound, unfinished pods by UID, what the core reads of them as last listed or
        watched (each read is a new copy)."""
        self.placed_terms = PlacedTerms()
        """Pod-affinity terms of placed pods that score nodes for other pods."""
        self.soft_tainted: set[str] = set()
        """Nodes with a ``PreferNoSchedule`` taint."""
        self.on_skipped = on_skipped
        self.on_failed = on_failed
        """Told of each pod listed or watched in phase Failed (``core.records.readmission``)."""
        self.on_freed = on_freed
        """Told when the watch shows a pod give back the GPU share it held (deleted, finished,
        its intent gone with it) and after each relist, which may have missed such a pod: the
        extender tries again the pods it refused just before (``Intents.freed_seen``)."""
        self.synced = False
        self.relists = 0
        self.problem = ""
        """Why the last list failed with something other than an API error; empty when not."""

    def _new_ledger(self, judged: Judged | None = None) -> Ledger:
        names, unit = self._settings.names, self._settings.unit
        if judged is not None:
            return Ledger(names=names, unit=unit, judged=judged)
        return Ledger(names=names, unit=unit, trust=self.trust)

    def _observe(self, ledger: Ledger, pod: KubeDict) -> None:
        why = ledger.observe(pod)
        if why is None or self.on_ignored is None:
            return
        report = self._reported.note(uid_of(pod), why.reason)
        if report.count:
            self.on_ignored(pod, why, first=report.tell)

    def _track(self, pending: PendingPods, pod: KubeDict) -> None:
        """Keep an unbound live pod in ``pending``; drop it once bound or finished."""
        uid = stored_uid_of(pod)
        if not uid:
            return
        if node_name_of(pod) or is_terminal(pod):
            pending.pop(uid, None)
        else:
            pending[uid] = pod

    def _failed(self, pod: KubeDict) -> None:
        if self.on_failed is not None and (pod.get("status") or {}).get("phase") == "Failed":
            self.on_failed(pod)

    def _skip(self, kind: str, obj: KubeDict, why: str) -> None:
        log.warning("%s=%s phase=watch skipped: %s", kind.lower(), _named(obj), why)
        if self.on_skipped is not None:
            self.on_skipped(kind, obj, why)

    def _readable(self, kind: str, obj: KubeDict) -> bool:
        """Whether ``obj`` has the shape the core reads; reported to ``on_skipped`` if not."""
        problem = node_shape(obj) if kind == "Node" else pod_shape(obj)
        if problem is None:
            return True
        self._skip(kind, obj, problem.message(kind))
        return False

    def _read(self, node: KubeDict) -> NodeInventory:
        return read_node(node, cluster_unit=self._settings.unit, names=self._settings.names)

    async def sync(self) -> tuple[str, str]:
        """List nodes and pods and rebuild from them; return both resourceVersions.

        Pods come a page at a time (``list_pod_pages``) and each page is read into a new
        ledger, pending set and terms before the next is fetched, so a relist holds one page
        of pods, not the cluster's. Until the last page everything the extender decides on
        stays as it was; then the new state replaces it at once, with no ``await`` between.
        """
        with self.health.step("nodes", "list"):
            listed_nodes, node_rv = await self._api.list_nodes()
        self.health.succeeded("nodes", "list")
        nodes = [n for n in listed_nodes if self._readable("Node", n)]
        table = NodeTable((name_of(n), self._read(n)) for n in nodes)
        soft_tainted = {name_of(n) for n in nodes if has_prefer_no_schedule_taint(n)}
        node_labels: dict[str, Mapping[str, str]] = {name_of(n): dict(labels_of(n)) for n in nodes}
        # what is read of the nodes is taken before the pods come, and the objects go: as
        # listed, 5,000 nodes are about 32 MiB, which the pods' new state would come on top of
        del listed_nodes, nodes
        judged = self.ledger.judged  # judgements of pods that did not change stand
        ledger = self._new_ledger(judged)
        pending = PendingPods()
        placed_terms = PlacedTerms()
        listed: set[str] = set()
        alive: set[str] = set()
        kept: dict[str, KubeDict] = {}
        """Bound pods that hold a booking: read again once the bookings are in (unbound ones
        are read again from ``pending``)."""
        counted: list[tuple[str, PodRequest]] = []
        placings: list[tuple[str, Placed | None, bool]] = []
        pod_rv = ""
        count = 0
        with self.health.step("pods", "list"):
            async for page, version in self._api.list_pod_pages():
                pod_rv = version
                for pod in page:
                    if not self._readable("Pod", pod):
                        continue
                    count += 1
                    uid = uid_of(pod)
                    listed.add(uid)
                    if not is_terminal(pod):
                        alive.add(uid)
                    self._observe(ledger, pod)
                    self._track(pending, pod)
                    self._failed(pod)
                    if node_name_of(pod) and self._books(uid):
                        kept[uid] = pod
                    placed_terms.observe(pod)
                    if self.workload is not None and not self.workload.counted(uid):
                        request = read_pod(pod, names=self.workload.names, unit=self.workload.unit)
                        if isinstance(request, PodRequest):
                            counted.append((uid, request))
                    if self.book is not None:
                        placings.append(placing_of(pod))
        self.health.succeeded("pods", "list")
        judged.retain(alive)
        self._reported.retain(alive)
        for assumed in self.ledger.assumptions():
            if assumed.uid in alive:  # a pod deleted while we were not watching frees it
                host = self.ledger.host_of(assumed.uid)
                until = self.ledger.intent_until(assumed.uid)
                if until is None:
                    ledger.assume(assumed, host)
                else:  # an intent stays one, with its deadline
                    booked = self.ledger.intent_booked(assumed.uid)
                    ledger.intend(assumed, host, until_ns=until, booked_ns=booked)
                seen = kept.get(assumed.uid) or pending.get(assumed.uid)
                if seen is not None:  # seen with the booking's placement, it ends the booking
                    ledger.observe(seen)
        if self.workload is not None:
            self.workload.retain(listed)
            for uid, request in counted:
                self.workload.count(uid, request)
        if self.book is not None:
            self.book.replace_node_labels(node_labels)
            self.book.retain_pods(alive)
            for uid, placed, terminal in placings:
                self.book.take_pod(uid, placed, terminal=terminal)
        self._digests.clear()
        self.nodes = table
        self.soft_tainted = soft_tainted
        self.placed_terms = placed_terms
        self.ledger = ledger
        self.pending = pending
        self.synced = True
        self.problem = ""
        self.relists += 1
        self._changed()
        self._freed()
        log.info("cache synced nodes=%d pods=%d relists=%d", len(table), count, self.relists)
        return node_rv, pod_rv

    def _books(self, uid: str) -> bool:
        """Whether the current ledger holds a bind's booking or an intent for the pod."""
        return self.ledger.kept(uid) is not None or self.ledger.intent_until(uid) is not None

    def apply_node(self, event: WatchEvent) -> None:
        """Take in one node event."""
        name = name_of(event.object)
        if event.type != "DELETED" and not self._readable("Node", event.object):
            return
        if event.type == "DELETED":
            self.nodes.pop(name, None)
            self.soft_tainted.discard(name)
            if self.book is not None:
                self.book.forget_node(name)
        elif event.type in ("ADDED", "MODIFIED"):
            self.nodes[name] = self._read(event.object)
            if has_prefer_no_schedule_taint(event.object):
                self.soft_tainted.add(name)
            else:
                self.soft_tainted.discard(name)
            if self.book is not None:
                self.book.observe_node(event.object)
        self._changed()

    def apply_pod(self, event: WatchEvent) -> None:
        """Take in one pod event; one that repeats what was taken in of a bound pod is
        passed over (``_digest``)."""
        digest = _digest(event.object) if event.type != "DELETED" else None
        uid = stored_uid_of(event.object)
        if digest is not None and self._digests.get(uid) == digest:
            return
        if event.type != "DELETED" and not self._readable("Pod", event.object):
            return
        held = bool(self.ledger.nodes_held_by(uid_of(event.object)))
        if digest is None:
            self._digests.pop(uid, None)
        else:
            if len(self._digests) >= DIGESTS_KEPT:
                self._digests.clear()
            self._digests[uid] = digest
        if event.type == "DELETED":
            self.pending.pop(uid, None)
            self.placed_terms.forget(uid_of(event.object))
            self.ledger.forget(uid_of(event.object))
            self._reported.forget(uid_of(event.object))
            if self.workload is not None:
                self.workload.forget(uid_of(event.object))
            if self.book is not None:
                self.book.forget_pod(uid_of(event.object))
        elif event.type in ("ADDED", "MODIFIED"):
            self._track(self.pending, event.object)
            self._failed(event.object)
            self.placed_terms.observe(event.object)
            self._observe(self.ledger, event.object)
            if self.book is not None:
                self.book.observe_pod(event.object)
            if self.workload is not None:
                self.workload.observe(event.object)
        self._changed()
        if held and not self.ledger.nodes_held_by(uid_of(event.object)):
            self._freed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _freed(self) -> None:
        if self.on_freed is not None:
            self.on_freed()

    async def _follow(self, node_rv: str, pod_rv: str) -> None:
        async def nodes() -> None:
            with self.health.step("nodes", "watch"):
                async for event in self._api.watch_nodes(node_rv):
                    self.backoff.reset()
                    self.health.succeeded("nodes", "watch")
                    self._apply("Node", self.apply_node, event)

        async def pods() -> None:
            with self.health.step("pods", "watch"):
                async for event in self._api.watch_pods(pod_rv):
                    self.backoff.reset()
                    self.health.succeeded("pods", "watch")
                    self._apply("Pod", self.apply_pod, event)

        async with asyncio.TaskGroup() as group:
            group.create_task(nodes())
            group.create_task(pods())

    def _apply(self, kind: str, apply: Callable[[WatchEvent], None], event: WatchEvent) -> None:
        """Take in one event; a reader that raises costs that event, never the watch."""
        try:
            apply(event)
        except Exception as err:  # the boundary: log, count, go on
            log.exception("%s=%s phase=watch event failed", kind.lower(), _named(event.object))
            self._skip(kind, event.object, f"{type(err).__name__}: {err}"[:300])

    async def run(self) -> None:
        """List, then watch, forever; relist on Gone at once, after a growing wait on errors."""
        while True:
            wait = 0.0
            try:
                node_rv, pod_rv = await self.sync()
                await self._follow(node_rv, pod_rv)
                self.backoff.reset()  # both streams ended without an error
            except* Gone as group:
                log.info("watch expired (%s); relisting", group.exceptions[0])
            except* KubeError as group:
                wait = self.backoff.failed()
                log.warning(
                    "API error (%s); relisting in %.1fs (failure %d in a row)",
                    group.exceptions[0],
                    wait,
                    self.backoff.failures,
                )
            except* Exception as group:  # a bug in a reader: keep trying, and say so
                wait = self.backoff.failed()
                self.problem = f"the last list failed: {group.exceptions[0]!r}"[:300]
                log.error("%s; relisting in %.1fs", self.problem, wait, exc_info=group)
            if wait:
                await self._sleep(wait)


DIGESTS_KEPT = 8192
"""Bound pods whose last event ``ClusterCache`` remembers, to pass over repeats: the status
updates kubelet writes come within seconds of the binding, so the most recent few thousand
pods are enough, and the memory stays small at any cluster size."""

_VOLATILE = frozenset(("resourceVersion", "managedFields"))
_encode = msgspec.json.encode


def _digest(pod: KubeDict) -> int | None:
    """A digest of everything the cache reads of a bound pod, or None for a pod it keeps
    whole (unbound: bind starts from that copy and its resourceVersion) or cannot key.

    The readers here (the ledger, the ResourcePolicy book, the scoring terms, the workload,
    the failed-pod hand-off) read the pod's metadata, its spec and whether its phase ended,
    never the rest of its status. kubelet's status updates (``Pending`` to ``Running``,
    container states) then repeat what was taken in, one to three events per pod that would
    each be judged, read and booked again. The hash is salted per process, so a tenant
    cannot make two different pods collide.
    """
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not spec.get("nodeName"):
        return None
    if not isinstance(meta.get("uid"), str) or not meta["uid"]:
        return None
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    ended = isinstance(phase, str) and phase in TERMINAL_PHASES
    kept = {k: v for k, v in meta.items() if k not in _VOLATILE}
    try:
        return hash(_encode((kept, spec, phase if ended else "")))
    except (TypeError, ValueError, OverflowError):  # not JSON after all: take it in as it is
        return None


def _named(obj: KubeDict) -> str:
    """``namespace/name`` of a pod, ``name`` of a node, for a log line, whatever its shape."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    name, namespace = meta.get("name"), meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)
