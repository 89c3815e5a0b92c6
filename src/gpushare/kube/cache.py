"""The extender's view of the cluster: a list-then-watch cache of nodes and pods.

The cache lists, watches, backs off and checks shapes; what it takes in goes to one
``ClusterState`` (``core.decision.clusterstate``), which owns the nodes, the ledger, the pending
pods, the scoring terms, the ResourcePolicy book, the trust and the workload feed, and says
what each event changed. The cache hands those values to the ``take`` its ``run`` (or
``sync``) is given; the extender counts, tells and retries from them.

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
(its last good version stays) and handed on as ``Skipped``, which the extender logs and counts.
The annotations and labels inside are strings whose readers turn any value into a reason, never
an exception. Should a reader still raise, the event is skipped and reported the same way rather
than ending the watch, and a failure of a whole list is kept in ``problem`` (``/readyz`` then
says the cache is not ready, and why) until a list succeeds again.

Every pod is judged as it comes in (core.records.trust): the ledger takes only allocations gpushare
sealed for that pod, once per pod version, so the filter never pays for it. An ignored one is
reported in ``PodTaken.ignored`` once per pod and reason (a relist does not count it again),
with a flag for the first report of that pod (the extender's metrics and Events use both).

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from gpushare.core.decision.clusterstate import ClusterState, NodeTaken, PodTaken, Relisted
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.kubejson import TERMINAL_PHASES, stored_uid_of
from gpushare.core.model.shape import node_shape, pod_shape
from gpushare.core.placement.defragmenting import WorkloadFeed
from gpushare.core.records.trust import Trust
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.kube.backoff import Backoff
from gpushare.kube.pendingpods import PendingPods
from gpushare.kube.port import Gone, KubeAPI, KubeDict, KubeError, WatchEvent
from gpushare.kube.sealing import keyless_trust
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Skipped:
    """A listed or watched object the cache could not take in, and why."""

    kind: str
    obj: KubeDict
    why: str


Change = NodeTaken | PodTaken | Relisted | Skipped
"""What one event, listed object or relist changed (``core.decision.clusterstate``)."""

Take = Callable[[Change], None]
"""Who acts on what changed: the extender's ``Extender.take``."""


def _drop(change: Change) -> None:
    """The default ``Take``: nobody acts on what changed (the demo, a benchmark)."""


class ClusterCache:
    """Lists and watches nodes and pods into one ``ClusterState``, kept current from the API."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        settings: Settings,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        workload: WorkloadFeed | None = None,
        trust: Trust | None = None,
        book: PolicyBook | None = None,
        health: WatchHealth | None = None,
    ) -> None:
        self._api = api
        self.health = health if health is not None else WatchHealth(role="its ClusterRole")
        """Where a refused list or watch is reported (kube.watchhealth); ``/readyz`` reads it."""
        self.backoff = backoff if backoff is not None else Backoff()
        """Waits between failed lists and watches."""
        self._sleep = sleep
        self.state = ClusterState(
            settings=settings,
            trust=trust if trust is not None else keyless_trust(api),
            workload=workload,
            book=book,
            pending_store=PendingPods,
        )
        """Everything taken in: what the decisions read (``core.decision.clusterstate``)."""
        self._digests: dict[str, int] = {}
        """What was last taken in of recently watched bound pods, by UID (``_digest``)."""
        self.synced = False
        self.relists = 0
        self.problem = ""
        """Why the last list failed with something other than an API error; empty when not."""

    def _skip(self, kind: str, obj: KubeDict, why: str) -> Skipped:
        log.warning("%s=%s phase=watch skipped: %s", kind.lower(), _named(obj), why)
        return Skipped(kind, obj, why)

    def _unreadable(self, kind: str, obj: KubeDict) -> Skipped | None:
        """Why ``obj`` has not the shape the core reads (None: it has)."""
        problem = node_shape(obj) if kind == "Node" else pod_shape(obj)
        if problem is None:
            return None
        return self._skip(kind, obj, problem.message(kind))

    def _readable(self, nodes: list[KubeDict], take: Take) -> list[KubeDict]:
        """The listed nodes of the shape the core reads; the others go to ``take``."""
        readable = []
        for node in nodes:
            skipped = self._unreadable("Node", node)
            if skipped is None:
                readable.append(node)
            else:
                take(skipped)
        return readable

    async def sync(self, take: Take = _drop) -> tuple[str, str]:
        """List nodes and pods and rebuild the state from them; return both resourceVersions.

        Pods come a page at a time (``list_pod_pages``) and each page is read into the
        state's ``Relist`` before the next is fetched, so a relist holds one page of pods,
        not the cluster's. Until the last page everything the extender decides on stays as
        it was; then the new state replaces it at once, with no ``await`` between. What each
        listed object changed goes to ``take`` as it is read, the relist itself last.
        """
        with self.health.step("nodes", "list"):
            listed_nodes, node_rv = await self._api.list_nodes()
        self.health.succeeded("nodes", "list")
        relist = self.state.relist(self._readable(listed_nodes, take))
        del listed_nodes  # the relist keeps what it read of them (``Relist``)
        pod_rv = ""
        with self.health.step("pods", "list"):
            async for page, version in self._api.list_pod_pages():
                pod_rv = version
                for pod in page:
                    skipped = self._unreadable("Pod", pod)
                    take(relist.take(pod) if skipped is None else skipped)
        self.health.succeeded("pods", "list")
        self._digests.clear()
        relisted = relist.finish()
        self.synced = True
        self.problem = ""
        self.relists += 1
        take(relisted)
        log.info(
            "cache synced nodes=%d pods=%d relists=%d",
            relisted.nodes,
            relisted.pods,
            self.relists,
        )
        return node_rv, pod_rv

    def apply_node(self, event: WatchEvent) -> NodeTaken | Skipped:
        """Take in one node event; what it changed."""
        if event.type != "DELETED":
            skipped = self._unreadable("Node", event.object)
            if skipped is not None:
                return skipped
        return self.state.apply_node(event.type, event.object)

    def apply_pod(self, event: WatchEvent) -> PodTaken | Skipped | None:
        """Take in one pod event; what it changed, or None for one that repeats what was
        taken in of a bound pod and is passed over (``_digest``)."""
        digest = _digest(event.object) if event.type != "DELETED" else None
        uid = stored_uid_of(event.object)
        if digest is not None and self._digests.get(uid) == digest:
            return None
        if event.type != "DELETED":
            skipped = self._unreadable("Pod", event.object)
            if skipped is not None:
                return skipped
        if digest is None:
            self._digests.pop(uid, None)
        else:
            if len(self._digests) >= DIGESTS_KEPT:
                self._digests.clear()
            self._digests[uid] = digest
        return self.state.apply_pod(event.type, event.object)

    async def _follow(self, node_rv: str, pod_rv: str, take: Take) -> None:
        async def nodes() -> None:
            with self.health.step("nodes", "watch"):
                async for event in self._api.watch_nodes(node_rv):
                    self.backoff.reset()
                    self.health.succeeded("nodes", "watch")
                    self._apply("Node", self.apply_node, event, take)

        async def pods() -> None:
            with self.health.step("pods", "watch"):
                async for event in self._api.watch_pods(pod_rv):
                    self.backoff.reset()
                    self.health.succeeded("pods", "watch")
                    self._apply("Pod", self.apply_pod, event, take)

        async with asyncio.TaskGroup() as group:
            group.create_task(nodes())
            group.create_task(pods())

    def _apply(
        self,
        kind: str,
        apply: Callable[[WatchEvent], Change | None],
        event: WatchEvent,
        take: Take,
    ) -> None:
        """Take in one event and hand on what changed; a reader that raises costs that event,
        never the watch."""
        try:
            change = apply(event)
        except Exception as err:  # the boundary: log, count, go on
            log.exception("%s=%s phase=watch event failed", kind.lower(), _named(event.object))
            change = self._skip(kind, event.object, f"{type(err).__name__}: {err}"[:300])
        if change is not None:
            take(change)

    async def run(self, take: Take = _drop) -> None:
        """List, then watch, forever; relist on Gone at once, after a growing wait on errors.
        What each list and event changed goes to ``take``."""
        while True:
            wait = 0.0
            try:
                node_rv, pod_rv = await self.sync(take)
                await self._follow(node_rv, pod_rv, take)
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
