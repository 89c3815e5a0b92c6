"""Intents and refused pods: the extender's memory between filter, prioritize and bind.

Prioritize (or a filter that answers with the top node alone) books the top node's GPUs for
the pod as an *intent* (``core.booking.ledger``) until its bind comes; bind's booking replaces it.
An
intent is given back when the pod is filtered again, when its bind fails, when the watch shows
it bound or gone, at its deadline, kept by the clock (``sweep``), and when a pod that fits
nowhere while it stands was there first, or it is older than ``HOLD_S`` (its pod waits past
PreBind or Permit: ``core.decision.yielding``, which no re-creating of pods or namespaces
resets). GPU pods the filter
refused on every node are remembered (``core.booking.waiting``) and touched when GPUs come back, so
kube-scheduler tries them again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from gpushare.core.booking.waiting import Waiting, WaitingPod
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.decision.verbs import Deadline, FilterOutcome, PrioritizeOutcome
from gpushare.core.decision.yielding import HOLD_S
from gpushare.core.model.kubejson import namespace_of
from gpushare.core.records.allocation import Allocation
from gpushare.extender.metrics import ExtenderMetrics

INTENT_TTL_S = 30.0
"""How long an intent booked at prioritize waits for its bind (``core.booking.ledger``).

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
"""How long an intent lasts for a pod the watch has not shown unbound yet (``deadline``).

kube-scheduler often filters a new pod a moment before the extender's own watch brings it
(both follow the same API server), so such a pod still books. But anything that reaches the
port can send a filter for a pod that does not exist, and its intent would hold GPUs for
nobody: so it lasts this long, and gets the full ``INTENT_TTL_S`` from its booking only once
the watch shows the pod (``sweep``)."""

RETRIES_PER_SWEEP = 20
"""At most this many refused pods are touched per sweep (``core.booking.waiting``): a crowd of them
costs the API server 20 writes a second at most, however much capacity comes back."""

LAG_S = 10.0
"""How far back ``Intents.freed_seen`` reaches: the pods refused this long before the
extender's watch showed GPU share given back are tried again. kube-scheduler's own watch may
show a deleted pod first; it then filters its refused pods again at once (after their back-off),
and those the extender refuses with its older view wait for nothing (on a loaded CI machine a
pod waiting for a terminating one stayed Pending that way). Pods refused earlier than this were
refused before the share came back, and kube-scheduler tries them again on the deletion itself;
10 s leaves room for a watch seconds behind, and touches at most ``RETRIES_PER_SWEEP`` pods a
second all the same."""
LAG_NS = int(LAG_S * 1e9)
HOLD_NS = int(HOLD_S * 1e9)


class IntentTerms(TypedDict):
    """How long an intent booked now lasts (``core.decision.verbs.intent_deadline``)."""

    now_ns: int
    ttl_ns: int
    unseen_ttl_ns: int


@dataclass(eq=False, kw_only=True)
class Intents:
    """The intents booked for pods on their way to bind, and the refused pods waiting."""

    state: ClusterState
    scheduler: Scheduler
    metrics: ExtenderMetrics
    clock_ns: Callable[[], int]
    ttl_s: Callable[[], float]
    waiting: Waiting = field(default_factory=Waiting, init=False)
    """GPU pods the filter refused, tried again when GPUs come back (``sweep``)."""
    _retry_before: int = field(default=0, init=False)
    """``Waiting.mark`` when GPUs last came back: the pods refused before it are due..."""
    _retry_after: int = field(default=0, init=False)
    """...and not before this mark (0: all of them); equal to ``_retry_before`` when none are
    due."""
    _marks: deque[tuple[int, int]] = field(default_factory=deque, init=False)
    """(clock ns, ``Waiting.mark``) at each sweep, oldest first, back to the first one at least
    ``LAG_S`` old: which refusals ``freed_seen`` reaches."""
    _stuck: dict[str, set[str]] = field(default_factory=dict, init=False)
    """By namespace: pods whose intent ran out with no bind, while pending (the core's
    ``namespace_stuck`` reads it)."""
    _holding: set[str] = field(default_factory=set, init=False)
    """Intents booked less than ``HOLD_S`` ago at the last sweep (``_overdue``)."""
    _unseen: dict[str, int] = field(default_factory=dict, init=False)
    """Intents of pods the watch had not shown yet, by UID: the deadline each gets once it
    does (``UNSEEN_TTL_S``)."""

    def filtered(self, outcome: FilterOutcome) -> None:
        """After a filter (``core.decision.verbs.filter_pod``): count the intents it gave back
        and booked, remember the pods whose intent ran out while pending, and remember the pod
        as waiting when it fits nowhere (the core did)."""
        self._expired(outcome.expired)
        self._yielded(outcome)
        if outcome.dropped:
            self.metrics.intents.labels("dropped").inc()
        if outcome.withheld:
            self.metrics.intents.labels("withheld").inc()
        if outcome.deadline is not None:
            self._deadline_taken(outcome.uid, outcome.deadline)
        self.booked(outcome.intent)

    def bind_failed(self, uid: str) -> None:
        """After a bind that failed for good: the pod's intent goes back, and with it GPUs
        that pods refused meanwhile may fit (kube-scheduler will try this pod again)."""
        if uid and self.scheduler.drop_intent(uid, self.state.ledger):
            self.metrics.intents.labels("dropped").inc()
            self.capacity_returned()

    def _expire(self) -> None:
        """Give back the intents past their deadline; their GPUs are free again."""
        self._expired(self.state.ledger.expire(self.clock_ns()))

    def _expired(self, expired: Sequence[str]) -> None:
        """Count intents given back at their deadline; their pods still pending are stuck."""
        if expired:
            self.metrics.intents.labels("expired").inc(len(expired))
            self.capacity_returned()
            pending = self.state.pending
            for uid in expired:
                pod = pending.get(uid)
                if pod is not None:
                    self._stuck.setdefault(namespace_of(pod), set()).add(uid)

    def _yielded(self, outcome: FilterOutcome) -> None:
        """Count intents given way to the filtered pod (``core.decision.yielding``): their GPUs
        beyond what it takes are free again, and the pods of those past ``HOLD_S`` are stuck."""
        yielded = outcome.yielded
        if not yielded.uids:
            return
        self.metrics.intents.labels("yielded").inc(len(yielded.uids))
        self.capacity_returned()
        pending = self.state.pending
        for uid in yielded.overdue:
            pod = pending.get(uid)
            if pod is not None:
                self._stuck.setdefault(namespace_of(pod), set()).add(uid)

    def _overdue(self) -> None:
        """An intent that passed ``HOLD_S`` since the last sweep no longer holds against a pod
        that fits nowhere else (``core.decision.yielding``): the pods refused meanwhile are
        due to be tried again, as when an intent runs out, or they would wait for its
        deadline with nothing telling kube-scheduler to try them."""
        since = self.clock_ns() - HOLD_NS
        holding: set[str] = set()
        passed = 0
        for allocation, _ in self.state.ledger.intents():
            booked = self.state.ledger.intent_booked(allocation.uid)
            if booked is None:
                continue
            if booked > since:
                holding.add(allocation.uid)
            elif allocation.uid in self._holding:
                passed += 1
        self._holding = holding
        if passed:
            self.metrics.intents.labels("overdue").inc(passed)
            self.capacity_returned()

    def _confirm_seen(self) -> None:
        """Give the intents of pods the watch now shows their full deadline (``UNSEEN_TTL_S``);
        forget the ones that ended."""
        ledger, pending = self.state.ledger, self.state.pending
        for uid, until in list(self._unseen.items()):
            if ledger.intent_until(uid) is None:
                del self._unseen[uid]
            elif uid in pending:
                ledger.extend(uid, until)
                del self._unseen[uid]

    def capacity_returned(self) -> None:
        """GPUs came back without an event kube-scheduler sees: the pods refused until now are
        due to be tried again (``sweep``)."""
        self._due(after=0)

    def freed_seen(self) -> None:
        """The watch showed GPU share given back (``PodTaken.freed``, ``Extender.take``), an event
        kube-scheduler sees too, maybe first: the pods refused in the last ``LAG_S`` are due to
        be tried again (``sweep``); kube-scheduler tries the older ones again itself."""
        self._due(after=self._mark_at(self.clock_ns() - LAG_NS))

    def _due(self, *, after: int) -> None:
        """The pods refused from the ``after`` mark until now are due, with those still due."""
        if self._retry_after < self._retry_before:
            after = min(after, self._retry_after)
        self._retry_after, self._retry_before = after, self.waiting.mark()

    def _mark_at(self, when_ns: int) -> int:
        """``Waiting.mark`` as of the last sweep at or before ``when_ns`` (0 before the first);
        older samples go."""
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= when_ns:
            marks.popleft()
        return marks[0][1] if marks and marks[0][0] <= when_ns else 0

    @property
    def stuck_pods(self) -> Mapping[str, set[str]]:
        """By namespace: pods whose intent ran out with no bind (``core.decision.verbs.
        namespace_stuck``); those no longer pending are forgotten at the next sweep."""
        return self._stuck

    def _stuck_in(self, namespace: str) -> set[str]:
        """The namespace's pods whose intent ran out with no bind and that are still pending."""
        stuck = self._stuck.get(namespace)
        if stuck is None:
            return set()
        pending = self.state.pending
        stuck.difference_update([uid for uid in stuck if uid not in pending])
        if not stuck:
            del self._stuck[namespace]
        return stuck

    def sweep(self) -> list[WaitingPod]:
        """Give back the intents past their deadline; the refused pods to try again now.

        Those are the pods refused before GPUs last came back, still unbound, at most
        ``RETRIES_PER_SWEEP`` (``core.booking.waiting``); the rest come at the next sweeps.
        """
        self._confirm_seen()
        self._expire()
        self._overdue()
        for namespace in list(self._stuck):
            self._stuck_in(namespace)  # forget the pods bound or gone meanwhile
        now = self.clock_ns()
        self._marks.append((now, self.waiting.mark()))
        self._mark_at(now - LAG_NS)
        if self._retry_after >= self._retry_before:
            return []  # none due: the book is not walked (pods before ``after`` stay in it)
        pending = self.state.pending
        taken = self.waiting.take(
            RETRIES_PER_SWEEP, before=self._retry_before, after=self._retry_after
        )
        if len(taken) < RETRIES_PER_SWEEP:  # every due pod taken
            self._retry_after = self._retry_before
        return [pod for pod in taken if pod.uid in pending]

    def prioritized(self, outcome: PrioritizeOutcome) -> None:
        """After a prioritize (``core.decision.verbs.prioritize_pod``): count the intent it
        withheld or booked, and remember a deadline taken for a pod the watch has not shown."""
        self._stuck_in(outcome.namespace)  # forget the pods bound or gone meanwhile
        if outcome.withheld:
            self.metrics.intents.labels("withheld").inc()
        if outcome.deadline is not None:
            self._deadline_taken(outcome.uid, outcome.deadline)
        self.booked(outcome.intent)

    def terms(self, now_ns: int) -> IntentTerms:
        """How long an intent booked at ``now_ns`` lasts, for ``intent_deadline``."""
        return IntentTerms(
            now_ns=now_ns,
            ttl_ns=int(self.ttl_s() * 1e9),
            unseen_ttl_ns=int(UNSEEN_TTL_S * 1e9),
        )

    def _deadline_taken(self, uid: str, deadline: Deadline) -> None:
        """An intent was asked for with this deadline: a pod the watch has not shown gets
        the full one once it does (``_confirm_seen``), and is counted as unseen."""
        if deadline.seen:
            self._unseen.pop(uid, None)
            return
        self.metrics.intents.labels("unseen").inc()
        self._unseen[uid] = deadline.full_ns

    def booked(self, booked: Allocation | None) -> str:
        """Count a booked intent; the node it is on, or an empty string for none."""
        if booked is None:
            return ""
        self.metrics.intents.labels("booked").inc()
        return booked.node
