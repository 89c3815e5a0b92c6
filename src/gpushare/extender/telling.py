"""Telling: the Events the extender writes on pods and ResourcePolicies, and their counters.

Every Event goes through ``Telling.tell``, which counts it, or counts it skipped when the
recorder's cap on Normal events is spent; a message may be a function, so a skipped one is
never built. Filtering and binding decide; they hand this module what to say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpushare.core.model.kubejson import KubeObject, key_of
from gpushare.core.model.names import ANN_ALLOCATION, SCHEDULER_NAME
from gpushare.core.model.requests import PodRequest, Rejection
from gpushare.core.placement.explain import refusal_summary, scheduler_says_it
from gpushare.core.records.trust import Ignored
from gpushare.core.resourcepolicies.gating import Gate, summary
from gpushare.core.resourcepolicies.resourcepolicy import (
    GROUP,
    KIND,
    VERSION,
    InvalidResourcePolicy,
    ResourcePolicy,
)
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

log = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Telling:
    """Says on objects what the extender decided, and counts what it says."""

    events: EventRecorder
    metrics: ExtenderMetrics
    scheduler_reports: bool
    """Whether a kube-scheduler calls this extender, and so writes the filter's reasons into
    its own FailedScheduling event: then ``GPUShareUnschedulable`` is written only where
    that event cannot carry them whole (``core.placement.explain.scheduler_says_it``), so a
    pending pod gets one Warning, not two that say the same. The demo and tests drive the extender
    without kube-scheduler, and keep it."""

    def tell(
        self, ref: PodRef, kind: EventKind, reason: str, message: str | Callable[[], str]
    ) -> None:
        """Queue an Event and count it, or count it skipped when the recorder's cap on Normal
        events is spent (``message`` may be a function, so a skipped one is never built)."""
        if not self.events.allows(kind):
            self.metrics.events_skipped.labels(reason).inc()
            return
        self.metrics.events.labels(reason).inc()
        self.events.record(ref, kind, reason, message if isinstance(message, str) else message())

    def skipped(self, kind: str, obj: KubeObject, why: str) -> None:
        """Count a watched object the cache could not take in (the cache logs it)."""
        reason = "shape" if why.startswith(kind) else "error"
        self.metrics.skipped.labels(kind, reason).inc()

    def ignored(self, pod: KubeObject, why: Ignored, *, first: bool) -> None:
        """Count an ignored allocation; on its pod's first, say so on the pod (an Event)."""
        key = key_of(pod)
        self.metrics.untrusted.labels(why.reason.value).inc()
        log.warning("pod=%s phase=trust allocation ignored: %s", key, why.message)
        if not first:
            return
        self.tell(
            PodRef.of(pod),
            "Warning",
            UNTRUSTED,
            f"gpushare ignores this pod's {ANN_ALLOCATION} annotation ({why.message}): only "
            f"allocations gpushare's scheduler wrote and sealed for this pod count, so it holds "
            f"no GPU share; create it with schedulerName {SCHEDULER_NAME} and without "
            f"spec.nodeName or gpushare annotations",
        )

    def policy_notice(self, policy: ResourcePolicy | InvalidResourcePolicy, notice: str) -> None:
        """Say on a ResourcePolicy what in it gpushare does not do or refuses (a Warning Event)."""
        ref = PodRef(
            namespace=policy.namespace,
            name=policy.name,
            uid=policy.uid,
            kind=KIND,
            api_version=f"{GROUP}/{VERSION}",
        )
        self.tell(ref, "Warning", POLICY_NOTICE, notice)

    def filtered(
        self,
        pod: KubeObject,
        request: PodRequest | Rejection,
        fits: bool,
        failed: dict[str, str],
        unresolvable: dict[str, str],
        deferred: int,
    ) -> None:
        """After a filter: count it and the hand-off deferrals (``deferred`` of the failed
        nodes); when no node fits, say why on the pod (an Event)."""
        outcome = (
            "rejected" if isinstance(request, Rejection) else ("fits" if fits else "unschedulable")
        )
        self.metrics.requests.labels("filter", outcome).inc()
        if deferred:
            self.metrics.deferrals.inc(deferred)
        if fits or not (failed or unresolvable):
            return
        if isinstance(request, PodRequest) and not request.wants_gpu:
            return
        reasons = [*failed.values(), *unresolvable.values()]
        if self.scheduler_reports and scheduler_says_it(reasons, len(reasons)):
            return
        self.tell(PodRef.of(pod), "Warning", UNSCHEDULABLE, refusal_summary(reasons, len(reasons)))

    def placed(self, ref: PodRef, message: str) -> None:
        """Say on the pod where it went and how full its GPUs are now (``BindPlan.placed``)."""
        self.tell(ref, "Normal", SCHEDULED, message)

    def unit(self, ref: PodRef, node: str, gate: Gate | None) -> None:
        """Say on the pod which unit of its ResourcePolicy took it, and why earlier ones did not."""
        if gate is None or gate.chosen is None:
            return
        unit = gate.chosen

        def message() -> str:
            where = f"ResourcePolicy {gate.policy} placed this pod in {unit.describe()} on {node}"
            if gate.passed:
                return f"{where}; it moved on because {summary(gate.passed)}"
            return f"{where}, the first unit, which had room"

        self.tell(ref, "Normal", POLICY_UNIT, message)
