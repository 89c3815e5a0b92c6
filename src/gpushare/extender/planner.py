"""Planning ahead (``--plan-ahead N``): the extender searches for kube-scheduler's next pods.

kube-scheduler filters every node itself before it calls the extender, once per pod; at
thousands of nodes that is most of its time. A pod whose ``status.nominatedNodeName`` is set
is tried on that node alone first (``core.planning``). So this task takes the pending pods in
kube-scheduler's queue order, plans each (``Extender.plan``: the top node, booked as the pod's
intent) and writes the node into the pod's status, at the resourceVersion the watch showed, so
a pod kube-scheduler nominated or bound meanwhile is left alone (a 409).

At most ``ahead`` planned pods wait at a time, each holding its booking for ``ttl_s``.
kube-scheduler counts a nominated pod's requests on its node, so a nomination never outlives
its booking: a plan never reached in that time (kube-scheduler stopped, another scheduler took
the pod) gives its GPUs back, its nomination is cleared, and its place goes to the next pod.
Plans are made only while kube-scheduler is asking (a filter within the last ``idle_s``):
with kube-scheduler stopped nothing would consume them.

Each pod is considered once while it is pending; a pod whose plan did not hold is searched by
kube-scheduler as usual, and the extender's filter answers it as it answers every pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging

from gpushare.core.kubejson import KubeObject, meta, name_of, namespace_of, stored_uid_of
from gpushare.core.planning import nominated_node_of, queue_order
from gpushare.extender.service import Extender
from gpushare.kube.port import Conflict, KubeDict, KubeError

log = logging.getLogger(__name__)

IDLE_S = 5.0
"""Plans stop when kube-scheduler has not filtered for this long."""

PLAN_TTL_S = 60.0
"""How long a plan's booking waits for its pod's filter: long enough for kube-scheduler to work
through a window of thousands of pods in whatever order its queue holds them; a plan never
reached (kube-scheduler stopped, another scheduler took the pod) then gives its GPUs back and
its nomination is cleared."""


class Planner:
    """Keeps up to ``ahead`` pending pods planned, in kube-scheduler's queue order."""

    def __init__(
        self,
        extender: Extender,
        *,
        ahead: int,
        idle_s: float = IDLE_S,
        ttl_s: float = PLAN_TTL_S,
    ) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1, got {ahead}")
        self.extender = extender
        self.ahead = ahead
        self.idle_s = idle_s
        self.ttl_s = ttl_s
        self._queue: list[tuple[tuple[int, str, str, str], str]] = []
        """Pending pods not yet considered, as a heap in queue order."""
        self._queued: set[str] = set()
        self._considered: set[str] = set()
        """Pods planned or judged unplannable, while pending: never considered again."""
        self.waiting: dict[str, str] = {}
        """Planned pods still pending: UID to the node they were nominated to."""
        self._wake = asyncio.Event()
        self._swept_ns = 0
        extender.cache.on_pending = self.pending
        extender.cache.on_change = self.poke  # a pod bound or gone may make room
        for pod in list(extender.cache.pending.values()):
            self.pending(pod)

    def pending(self, pod: KubeObject) -> None:
        """The cache saw an unbound pod: queue it if it is new."""
        uid = stored_uid_of(pod)
        if uid and uid not in self._queued and uid not in self._considered:
            self._queued.add(uid)
            heapq.heappush(self._queue, (queue_order(pod), uid))
            self._wake.set()

    def poke(self) -> None:
        """Look for room now (kube-scheduler filtered, or a pod was bound)."""
        self._wake.set()

    def _asking(self) -> bool:
        last = self.extender.last_filter_ns
        return bool(last) and self.extender.clock_ns() - last < self.idle_s * 1e9

    async def _sweep(self) -> None:
        """Forget plans whose pods left or whose bookings are gone; clear the nomination of a
        pod still pending that holds nothing (its plan's time ran out).

        kube-scheduler counts a nominated pod's requests on its node for every pod of equal or
        lower priority (``RunFilterPluginsWithNominatedPods``), so a nomination must not
        outlive the booking behind it: the extender would offer the GPUs again while
        kube-scheduler still sees them taken. The clearing carries the watched resourceVersion,
        so a pod bound or nominated anew meanwhile is left alone (a 409).
        """
        pending, ledger = self.extender.cache.pending, self.extender.cache.ledger
        now = self.extender.clock_ns()
        self._swept_ns = now
        expired = ledger.expire(now)
        if expired:
            self.extender.metrics.intents.labels("expired").inc(len(expired))
        stale: list[KubeDict] = []
        for uid, node in list(self.waiting.items()):
            pod = pending.get(uid)
            if pod is not None and ledger.holding(uid) is not None:
                continue  # still booked: planned, filtered or being bound
            del self.waiting[uid]
            if pod is not None and nominated_node_of(pod) == node:
                stale.append(pod)
        if len(self._considered) > 2 * len(pending) + 1024:
            self._considered &= pending.keys()
        for pod in stale:
            try:
                await self.extender.api.nominate_pod(
                    namespace_of(pod),
                    name_of(pod),
                    "",
                    resource_version=str(meta(pod).get("resourceVersion") or ""),
                )
            except KubeError as err:
                log.info("pod=%s/%s phase=plan clear: %s", namespace_of(pod), name_of(pod), err)
                continue
            self.extender.metrics.plans.labels("cleared").inc()

    async def _room(self) -> int:
        """Places left in the window, swept when full and at least once a second."""
        if len(self.waiting) >= self.ahead or self.extender.clock_ns() - self._swept_ns > 1e9:
            await self._sweep()
        return self.ahead - len(self.waiting)

    async def plan_some(self) -> int:
        """Plan pods until ``ahead`` wait or none is left; the number nominated."""
        cache = self.extender.cache
        nominated = 0
        while cache.synced and self._queue and self._asking() and await self._room() > 0:
            _, uid = heapq.heappop(self._queue)
            self._queued.discard(uid)
            pod = cache.pending.get(uid)
            if pod is None or uid in self._considered:
                continue
            self._considered.add(uid)
            node = self.extender.plan(pod, ttl_s=self.ttl_s)
            if node and await self._nominate(pod, uid, node):
                self.waiting[uid] = node
                nominated += 1
        return nominated

    async def _nominate(self, pod: KubeDict, uid: str, node: str) -> bool:
        """Write the plan into the pod's status; on failure give its booking back."""
        extender = self.extender
        booked_until = extender.cache.ledger.intent_until(uid)
        version = str(meta(pod).get("resourceVersion") or "")
        try:
            await extender.api.nominate_pod(
                namespace_of(pod), name_of(pod), node, resource_version=version
            )
        except KubeError as err:
            outcome = "conflict" if isinstance(err, Conflict) else "error"
            extender.metrics.plans.labels(outcome).inc()
            log.info("pod=%s/%s phase=plan %s: %s", namespace_of(pod), name_of(pod), outcome, err)
            # give back only the plan's own booking: the pod's filter may have booked anew
            ledger = extender.cache.ledger
            own = ledger.intent_until(uid) == booked_until
            if own and extender.scheduler.drop_intent(uid, ledger):
                extender.metrics.intents.labels("dropped").inc()
            return False
        extender.metrics.plans.labels("nominated").inc()
        return True

    async def run(self) -> None:
        """Plan whenever there is news, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.idle_s)
            self._wake.clear()
            try:
                await self.plan_some()
            except Exception:  # a bug must not stop planning for good; the filter still works
                log.exception("phase=plan unexpected error")
