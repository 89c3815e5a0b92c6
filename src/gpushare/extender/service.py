"""The extender: kube-scheduler's filter, prioritize and bind over the cache, split by verb.

- ``extender.filtering``: filter and prioritize (``Filtering``);
- ``extender.binding``: bind, one at a time per pod, never double-booking (``Binding``; its
  outcomes are values: a ``Status`` per try, counted by its ``BindOutcome`` from
  ``core.decision.verbs``);
- ``extender.intents``: the intents booked between filter and bind, and the refused pods tried
  again when GPUs come back (``Intents``), kept by the clock (``Extender.keep_intents``);
- ``extender.telling``: the Events said on pods and policies, and their counters (``Telling``).

Each verb asks the core once (``core.decision.verbs``: ``filter_pod``, ``reserve_bind`` per
bind try) and answers, writes, counts and tells from the value it gets back.

``Extender`` puts them together over one cache, scheduler, metrics and clock, and is what the
app, the demo and the tests hold. What the cache takes in comes back as values
(``core.decision.clusterstate``), which ``Extender.take`` acts on: the cache's ``run`` is
given it, nothing is wired into the cache afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpushare.core.booking.waiting import Waiting, WaitingPod
from gpushare.core.decision.clusterstate import PodTaken, Relisted
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.model.names import ANN_RETRY, SCHEDULER_NAME
from gpushare.core.resourcepolicies.resourcepolicy import InvalidResourcePolicy, ResourcePolicy
from gpushare.extender.binding import Binding
from gpushare.extender.events import EventRecorder
from gpushare.extender.filtering import Filtering
from gpushare.extender.intents import INTENT_TTL_S, UNSEEN_TTL_S, Intents
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.telling import Telling
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
)
from gpushare.kube.cache import Change, ClusterCache, Skipped
from gpushare.kube.port import KubeAPI, KubeDict, KubeError, NotFound

__all__ = ["INTENT_TTL_S", "SWEEP_S", "UNSEEN_TTL_S", "Extender"]

log = logging.getLogger(__name__)

SWEEP_S = 1.0
"""How often the intents past their deadline are given back (``Extender.keep_intents``)."""


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
        on_failed: Callable[[KubeDict], None] | None = None,
    ) -> None:
        self.api = api
        self.intent_ttl_s = intent_ttl_s
        self.cache = cache
        self.scheduler = scheduler
        self.metrics = metrics or ExtenderMetrics(lambda: cache)
        self.attempts = attempts
        self.clock_ns = clock_ns
        # the parts read the clock and the deadline through this object, so a test (or the
        # demo) that sets them here sets them for every part
        self.telling = Telling(
            events=events if events is not None else EventRecorder(api),
            metrics=self.metrics,
            scheduler_reports=scheduler_reports,
        )
        self.intents = Intents(
            state=cache.state,
            scheduler=scheduler,
            metrics=self.metrics,
            clock_ns=lambda: self.clock_ns(),
            ttl_s=lambda: self.intent_ttl_s,
        )
        self.filtering = Filtering(
            state=cache.state,
            scheduler=scheduler,
            metrics=self.metrics,
            intents=self.intents,
            telling=self.telling,
            clock_ns=lambda: self.clock_ns(),
            packing_profile=packing_profile,
        )
        self.binding = Binding(
            api=api,
            state=cache.state,
            scheduler=scheduler,
            metrics=self.metrics,
            intents=self.intents,
            telling=self.telling,
            attempts=attempts,
            clock_ns=lambda: self.clock_ns(),
        )
        self.on_failed = on_failed
        """Told of each pod listed or watched in phase Failed (``extender.readmitting``)."""

    def take(self, change: Change | None) -> None:
        """Act on what the cache took in (``ClusterCache.run`` hands each change here): count
        and tell an object skipped or an allocation ignored, hand a Failed pod on, and when
        GPU share came back (a pod gave it back, or a relist may have missed one) try again
        the pods refused just before (``Intents.freed_seen``)."""
        if isinstance(change, PodTaken):
            if change.ignored is not None:
                self.telling.ignored(change.pod, change.ignored, first=change.first)
            if change.failed and self.on_failed is not None:
                self.on_failed(change.pod)
            if change.freed:
                self.intents.freed_seen()
        elif isinstance(change, Skipped):
            self.telling.skipped(change.kind, change.obj, change.why)
        elif isinstance(change, Relisted):
            self.intents.freed_seen()

    @property
    def events(self) -> EventRecorder:
        """Where Events go (``Telling``)."""
        return self.telling.events

    @events.setter
    def events(self, recorder: EventRecorder) -> None:
        self.telling.events = recorder

    @property
    def scheduler_reports(self) -> bool:
        """Whether a kube-scheduler writes the filter's reasons itself (``Telling``)."""
        return self.telling.scheduler_reports

    @scheduler_reports.setter
    def scheduler_reports(self, reports: bool) -> None:
        self.telling.scheduler_reports = reports

    @property
    def packing_profile(self) -> str:
        """The profile whose pods get the top node alone (``Filtering``)."""
        return self.filtering.packing_profile

    @packing_profile.setter
    def packing_profile(self, profile: str) -> None:
        self.filtering.packing_profile = profile

    @property
    def waiting(self) -> Waiting:
        """GPU pods the filter refused, tried again when GPUs come back (``Intents``)."""
        return self.intents.waiting

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Split the given nodes into passing, failed and unresolvable, with reasons."""
        return self.filtering.filter(args)

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Scores 0..10 for the given nodes, as (hosts, scores); unknown names are left out."""
        return self.filtering.prioritize(args)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Annotate then bind, never double-booking (``extender.binding``)."""
        return await self.binding.bind(args)

    def policy_notice(self, policy: ResourcePolicy | InvalidResourcePolicy, notice: str) -> None:
        """Say on a ResourcePolicy what in it gpushare does not do or refuses (a Warning Event)."""
        self.telling.policy_notice(policy, notice)

    def sweep(self) -> list[WaitingPod]:
        """Give back the intents past their deadline; the refused pods to try again now."""
        return self.intents.sweep()

    async def retry(self, pods: list[WaitingPod]) -> None:
        """Ask kube-scheduler to try these refused pods again: an annotation on each is an
        update of the pod, which moves a pod only the extender refused back to its queue
        (``core.booking.waiting``). A pod gone meanwhile is skipped; a failed write is logged."""
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
