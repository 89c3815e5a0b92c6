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
   (``core.booking.ledger``), so the pods kube-scheduler sent on meanwhile were not given them;
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
  that node with its allocation (``core.records.binding``), and fails otherwise, changing nothing;
- after a failed binding the pod is read again: bound to the booked node means success (the
  binding went through), bound elsewhere means failure with the annotations kept, and only a
  pod still unbound is cleared, with its resourceVersion, so a binding that lands meanwhile
  turns the clearing into a 409 instead of a bound pod without annotations. When the pod cannot
  be read, annotations and booking stay (holding a GPU too long is safe; double-booking is not);
- binds of one pod run one at a time, so a retry arriving while the first bind is still
  waiting on the API finds its outcome instead of racing it.

The annotations bind writes carry a seal (``gpushare.io/seal``, core.records.trust) made with the
key
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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from gpushare.core.booking.ledger import Kept
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.decision.verbs import (
    BIND,
    BIND_OUTCOMES,
    BOUND,
    DECIDED_FROM_THE_COPY,
    SUCCEEDED,
    BindAsk,
    BindOutcome,
    BindPlan,
    copy_will_do,
    reserve_bind,
)
from gpushare.core.model.kubejson import annotations_of, node_name_of, uid_of
from gpushare.core.model.names import POD_ANNOTATIONS
from gpushare.core.model.status import Code, Status, refused
from gpushare.extender.events import PodRef
from gpushare.extender.intents import Intents
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.telling import Telling
from gpushare.extender.wire import ExtenderBindingArgs, ExtenderBindingResult
from gpushare.kube.port import Conflict, KubeAPI, KubeDict, KubeError, NotFound

__all__ = ["BOUND", "BindOutcome", "Binding", "OnePerKey"]

log = logging.getLogger(__name__)


class OnePerKey:
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


@dataclass(eq=False, kw_only=True)
class Binding:
    """Serves kube-scheduler's bind calls, one at a time per pod."""

    api: KubeAPI
    state: ClusterState
    scheduler: Scheduler
    metrics: ExtenderMetrics
    intents: Intents
    telling: Telling
    attempts: int
    clock_ns: Callable[[], int]
    _binding: OnePerKey = field(default_factory=OnePerKey, init=False)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Annotate then bind, never double-booking; see the module docstring."""
        key = f"{args.PodNamespace}/{args.PodName}"
        async with self._binding.hold(key):
            return await self._bind(args, key)

    async def _bind(self, args: ExtenderBindingArgs, key: str) -> ExtenderBindingResult:
        error = ""
        # the watch's copy of the pod saves a read (see the module docstring), when it will do
        watched = self.state.pending.get(args.PodUID) if args.PodUID else None
        if watched is not None and not copy_will_do(self.state.ledger, args.PodUID):
            watched = None
        attempt = 0
        while attempt < self.attempts:
            attempt += watched is None  # a try on the watched copy is not one of them
            try:
                result = await self._bind_once(args, key, watched)
            except Exception as err:  # a bug must not become a 500 with a booking left behind
                log.exception("pod=%s node=%s phase=bind unexpected error", key, args.Node)
                error = f"bind {key}: internal error {type(err).__name__}: {err}"
                result = await self._settle(args, key, args.PodUID, error)
            outcome, error = BIND_OUTCOMES[result.code], result.message
            if watched is not None and outcome in DECIDED_FROM_THE_COPY:
                # A write carries the copy's resourceVersion, so a success was checked against
                # the API; these answers came from the copy before any write: read, try again.
                if outcome is BindOutcome.CONFLICT:
                    self.metrics.binds.labels(outcome.value).inc()
                watched = None
                continue
            self.metrics.binds.labels(outcome.value).inc()
            if outcome in SUCCEEDED:
                self.metrics.requests.labels("bind", "bound").inc()
                return ExtenderBindingResult()
            if outcome is not BindOutcome.CONFLICT:
                break
            log.info("pod=%s node=%s phase=bind conflict attempt=%d", key, args.Node, attempt)
        self.metrics.requests.labels("bind", "error").inc()
        self.intents.bind_failed(args.PodUID)  # the pod will be tried again
        log.warning("pod=%s node=%s phase=bind error=%r", key, args.Node, error)
        return ExtenderBindingResult(Error=error)

    async def _bind_once(
        self, args: ExtenderBindingArgs, key: str, watched: KubeDict | None = None
    ) -> Status:
        """One try: from the watched copy of the pod when given, else from a fresh read. One
        core call decides and reserves (``core.decision.verbs.reserve_bind``); then the writes
        and the Events."""
        if watched is not None:
            pod = watched
        else:
            try:
                pod = await self.api.get_pod(args.PodNamespace, args.PodName)
            except KubeError as err:
                return _error(f"cannot read pod {key}: {err}")
        # no await from here to the writes: the check and the bookings are one step
        ask = BindAsk(pod=pod, node=args.Node, asked_uid=args.PodUID, now_ns=self.clock_ns())
        plan = reserve_bind(self.scheduler, self.state, ask)
        if isinstance(plan, Status):
            if plan.code is Code.SKIP:
                log.info(
                    "pod=%s node=%s phase=bind already bound there; nothing to do", key, args.Node
                )
            return plan
        failed = await self._write_and_bind(args, key, plan)
        if failed is not None:
            return failed
        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=plan.uid)
        booked = plan.allocation
        if booked is not None:
            self.telling.placed(ref, plan.placed)
        self.telling.unit(ref, args.Node, plan.gate)
        if booked is not None:
            log.info(
                "pod=%s node=%s gpu=%s mem=%d phase=bind bound",
                key,
                args.Node,
                plan.gpus,
                plan.mem_units,
            )
        return BOUND

    async def _write_and_bind(
        self, args: ExtenderBindingArgs, key: str, plan: BindPlan
    ) -> Status | None:
        """Write the plan's annotations and bind; None when bound, else the outcome and error.

        One ``pods/binding`` carries the annotations, at the resourceVersion bind read: the
        API server sets the node and the annotations in one update, or neither. A merge patch
        goes first only for what a binding cannot do (``BindPlan.patch_first``): labels (a
        ResourcePolicy unit's ``podLabels``; a binding's labels count only with
        PodTopologyLabelsAdmission) and removing an annotation the pod carries. After an error
        whose effect is unknown, the pod is read again (``_settle``, which decides what to give
        back); when nothing was written, this try's bookings are given back here, and
        ``BindPlan.kept``, the booking the pod held before it (``Ledger.kept``), comes back:
        the 409 may be the earlier binding that booked it, landed meanwhile, and its GPUs must
        stay taken until the watch shows them.
        """
        uid, version = plan.uid, plan.version
        if plan.patch_first:
            failed = await self._annotate(args, key, plan)
            if failed is not None:
                self._give_back(uid, kept=plan.kept)
                return failed
        carried = plan.carried
        if plan.patch_first:
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
            if not plan.patch_first:  # nothing was written: read it again and start over
                self._give_back(uid, kept=plan.kept)
                return refused(
                    Code.CONFLICT, f"pod {key} changed or was bound while binding: {err}", BIND
                )
            settled = await self._settle(args, key, uid, f"bind {key} to {args.Node}: {err}")
            if not settled.ok:
                return settled
        except KubeError as err:
            settled = await self._settle(args, key, uid, f"bind {key} to {args.Node}: {err}")
            if not settled.ok:
                return settled
        return None

    def _give_back(self, uid: str, *, kept: Kept | None = None) -> None:
        """Give back what this bind booked, in every store: its GPUs (``kept``, the booking the
        pod held before, comes back) and its ResourcePolicy unit. Idempotent."""
        state = self.state
        self.scheduler.unreserve(uid, state.ledger, kept=kept, book=state.book)

    async def _annotate(self, args: ExtenderBindingArgs, key: str, plan: BindPlan) -> Status | None:
        """Write the plan's annotations and labels (the caller gives the bookings back when
        this fails)."""
        try:
            await self.api.patch_pod_annotations(
                args.PodNamespace,
                args.PodName,
                plan.annotations,
                resource_version=plan.version,
                **({"labels": plan.labels} if plan.labels else {}),
            )
        except Conflict as err:
            return refused(Code.CONFLICT, f"pod {key} kept changing while binding: {err}", BIND)
        except KubeError as err:
            return _error(f"annotate {key}: {err}")
        return None

    async def _settle(self, args: ExtenderBindingArgs, key: str, uid: str, error: str) -> Status:
        """After a failed or unknown binding, read the pod to learn what happened.

        Annotations are removed only from a pod seen unbound, and only at the resourceVersion it
        was seen at; a pod bound meanwhile keeps them (see the module docstring).
        """
        for _ in range(self.attempts):
            try:
                pod = await self.api.get_pod(args.PodNamespace, args.PodName)
            except NotFound:
                self._give_back(uid)
                return _error(f"{error}; pod {key} no longer exists")
            except KubeError as err:
                return _error(
                    f"{error}; cannot read pod {key} to learn whether it is bound ({err}): its "
                    f"annotations and booking stay until the watch shows it",
                )
            seen = uid_of(pod)
            if uid and seen != uid:
                self._give_back(uid)
                return _error(f"{error}; pod {key} was recreated (UID {seen})")
            uid = seen
            bound_to = node_name_of(pod)
            if bound_to == args.Node:
                log.info("pod=%s node=%s phase=bind bound despite: %s", key, args.Node, error)
                return BOUND
            if bound_to:
                self._give_back(uid)
                return _error(
                    f"{error}; pod {key} is bound to node {bound_to}: its annotations are kept",
                )
            self._give_back(uid)
            if not any(name in annotations_of(pod) for name in POD_ANNOTATIONS):
                return _error(error)
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
            return _error(error)
        log.warning("pod=%s phase=unreserve pod kept changing; annotations left", key)
        return _error(error)


def _error(reason: str) -> Status:
    """A bind try that failed with an error kube-scheduler is told."""
    return refused(Code.ERROR, reason, BIND)
