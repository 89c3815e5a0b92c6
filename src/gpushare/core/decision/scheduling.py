"""The scheduler's extension points over an explicit snapshot: filter, score, reserve.

``Scheduler`` holds settings, the node policy and the decision cache; every call gets the node
inventories and the ledger it should decide on. The extender, the demo and the simulator all
drive this one class. Two ways in decide alike: node lists (``filter``, ``prioritize``) and
node names from the cache's ``NodeTable`` (``filter_names``, ``prioritize_names``, for
kube-scheduler's ``nodeCacheCapable`` calls over thousands of names). Both, and ``reserve``
that bind runs, read one ``DecisionCache`` (``core.decision.cache``); a test keeps them in
agreement.
What one decision is lives in ``core.decision.decider``, how scores become 0..10 in
``core.placement.ranking``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import eq, is_not
from typing import cast

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Kept, Ledger
from gpushare.core.decision.cache import DecisionCache
from gpushare.core.decision.decider import Decider, Decision
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.kubejson import KubeObject, key_of
from gpushare.core.model.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.model.requests import PodRequest, Readings, Rejection
from gpushare.core.model.status import SUCCESS, Code, Status
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.defragmenting import WorkloadFeed, all_policies
from gpushare.core.placement.filtering import Rules, Verdict, refusal
from gpushare.core.placement.ranking import absolute, normalized, single_top
from gpushare.core.placement.scoring import NodePolicy, PolicyRegistry
from gpushare.core.records.allocation import Allocation, plan
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.core.resourcepolicies.policyplugin import (
    UnitReservation,
    reserve_unit,
    unreserve_unit,
)

__all__ = ["FilterResult", "NamesResult", "Reservation", "Scheduler", "Settings"]


@dataclass(frozen=True)
class Settings:
    """Cluster-wide scheduling settings, validated at the config edge."""

    unit: MemoryUnit = MemoryUnit.GiB
    max_pods_per_gpu: int | None = None
    policy: str = "gpushare"
    names: ResourceNames = DEFAULT_NAMES

    @property
    def rules(self) -> Rules:
        """The filter's view of these settings."""
        return Rules(cluster_unit=self.unit, max_pods_per_gpu=self.max_pods_per_gpu)


@dataclass(frozen=True)
class FilterResult:
    """A pod's verdict on every node asked about."""

    request: PodRequest | Rejection
    verdicts: tuple[Verdict, ...] = ()

    @property
    def passing(self) -> list[str]:
        """Names of the nodes that fit."""
        return [v.node for v in self.verdicts if v.fits]


@dataclass(frozen=True)
class NamesResult:
    """A filter over node names, as kube-scheduler gets it back with ``nodeCacheCapable``
    (``filter_names``); the same for node objects before a ResourcePolicy
    (``core.decision.verbs.filter_pod``)."""

    request: PodRequest | Rejection
    passing: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    missing: list[str]
    scores: list[float] | None = None
    """The raw score of each passing name, in order, when the filter read them on the way
    (``top_name`` takes them instead of looking every name up again); None when not."""
    deferred: int = 0
    """How many of the ``failed`` nodes wait for another pod to start (``Code.WAIT``: the
    device plugin's hand-off, ``core.records.handoff``)."""


@dataclass(frozen=True)
class Booking:
    """The GPUs ``Scheduler.reserve`` booked for a pod on one node; or, when ``status`` is not
    ok, the filter's status saying why they no longer fit (then nothing is booked)."""

    allocation: Allocation | None
    """The GPUs booked; None when refused."""
    status: Status = SUCCESS


@dataclass(frozen=True)
class Reservation:
    """A pod reserved in every booking store, its ResourcePolicy unit and its GPUs; or, when
    ``status`` is not ok, why not (then nothing is held)."""

    unit: UnitReservation
    allocation: Allocation | None
    """The GPUs booked; None for a pod that asks for none, or when refused."""
    status: Status = SUCCESS
    """The unit's refusal, or why the GPUs no longer fit (``reserve_pod``)."""


@dataclass
class Scheduler:
    """Filter, score and reserve for shared-GPU pods.

    With a ``ChoosingPolicy`` (``fgd``, ``gpushare``) the policy also picks the GPU inside each
    node, so the filter's verdict, the score and the booking at bind all use its choice.
    """

    settings: Settings = field(default_factory=Settings)
    workload: WorkloadFeed | None = None
    """The target workload the fragmentation-aware policies learn; the cache feeds it."""
    registry: PolicyRegistry | None = None
    keys_kept: int = 256
    """Request keys whose decisions are kept before the decision cache starts over."""

    def __post_init__(self) -> None:
        if self.workload is None:
            self.workload = WorkloadFeed(names=self.settings.names, unit=self.settings.unit)
        if self.registry is None:
            self.registry = all_policies(self.workload)
        self.policy: NodePolicy = self.registry.get(self.settings.policy)  # fails early
        self.decider = Decider(self.settings.rules, self.policy)
        self.decisions = DecisionCache(self.decider, limit=self.keys_kept)
        names, unit = self.settings.names, self.settings.unit
        feed = self.workload
        alike = feed.names == names and feed.unit == unit
        self.readings = feed.readings if alike else Readings(names=names, unit=unit)
        """Pods as stored, read once per version: the workload feed's, when it reads alike."""
        self._asked_readings = Readings(names=names, unit=unit)

    def _survey(
        self,
        ledger: Ledger,
        *,
        table: Mapping[str, NodeInventory] | None = None,
        shown: Iterable[NodeInventory] = (),
    ) -> None:
        """Let the policy catch up with the cluster before anything is decided: with ``table``
        every node of it (a policy that weighs cluster-wide supply), else the nodes shown."""
        policy = self.decider.choosing
        if policy is None:
            return
        if table is not None:
            policy.follow(table, ledger)
        else:
            policy.show(shown, ledger)

    def read(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod's request under these settings: a pod as the API server stored it
        (bind's), whose reading is kept for its version (``Readings``)."""
        return self.readings.read(pod)

    def _read_asked(self, pod: KubeObject) -> PodRequest | Rejection:
        """``read`` for the pod in a filter or prioritize body, which kube-scheduler sends
        again and again for one version of a pending pod.

        The reading of that version from the watch serves when there is one; otherwise the
        body is read into this scheduler's own ``Readings``, apart from the one bind reads, so
        a body that named a real pod's UID and version over another spec could mislead an
        answer, never a booking.
        """
        known = self.readings.get(pod)
        return known if known is not None else self._asked_readings.read(pod)

    def _asked(self, pod: KubeObject) -> PodRequest | Rejection:
        """Read a pod that is being scheduled, and count it in the target workload.

        Counting here, not only from the cache's watch, makes the decision independent of
        whether the watch event for the pod arrived before kube-scheduler's call (the feed
        counts each UID once, so the watch's later event changes nothing).
        """
        request = self._read_asked(pod)
        if isinstance(request, PodRequest) and self.workload is not None:
            self.workload.count(request.uid, request)
        return request

    def filter_names(
        self, pod: KubeObject, names: list[str], nodes: NodeTable, ledger: Ledger
    ) -> NamesResult:
        """``filter`` over node names from the cache's table, answered by outcome from the
        decision cache's indexes."""
        request = self._asked(pod)
        self._survey(ledger, table=nodes)
        wanted = set(names)
        if isinstance(request, Rejection) or not request.wants_gpu:
            missing = [] if nodes.keys() >= wanted else [n for n in names if n not in nodes]
            if isinstance(request, Rejection):
                reason = request.message
                known = {n: reason for n in names if n in nodes}
                return NamesResult(request, [], {}, known, missing)
            return NamesResult(request, [n for n in names if n in nodes], {}, {}, missing)
        outcomes = self.decisions.on_names(request, wanted, nodes, ledger)
        gone = outcomes.absent & wanted if outcomes.absent else None
        missing = [n for n in names if n in gone] if gone else []
        # one pass of lookups, then passes over the scores alone (no string compared again)
        raws = list(map(outcomes.fits.get, names))
        fitting = list(map(_is_score, raws))
        passing = list(compress(names, fitting))
        scores: list[float] | None = cast(list[float], list(compress(raws, fitting)))
        failed = _within(outcomes.failed, wanted)
        unresolvable = _within(outcomes.unresolvable, wanted)
        deferred = outcomes.deferred & wanted if outcomes.deferred else set()
        again = self.decisions.rebinding(request, wanted, nodes, ledger)
        if again:
            for name, (verdict, _) in again.items():
                failed.pop(name, None)
                unresolvable.pop(name, None)
                deferred.discard(name)
                if verdict.status.may_pass_later:
                    failed[name] = verdict.message
                    if verdict.code is Code.WAIT:
                        deferred.add(name)
                elif verdict.code is Code.UNRESOLVABLE:
                    unresolvable[name] = verdict.message
            fits = {n for n, (v, _) in again.items() if v.fits}
            passing = [n for n in names if (n in fits or (n in outcomes.fits and n not in again))]
            scores = None
        return NamesResult(request, passing, failed, unresolvable, missing, scores, len(deferred))

    def prioritize_names(
        self, pod: KubeObject, names: list[str], nodes: NodeTable, ledger: Ledger
    ) -> list[int]:
        """``prioritize`` over node names from the cache's table: 0..10 per name, in order."""
        request = self._asked(pod)
        if isinstance(request, Rejection) or not request.wants_gpu:
            return [0] * len(names)
        self._survey(ledger, table=nodes)
        known = self.decisions.on_names(request, set(names), nodes, ledger)
        again = self.decisions.rebinding(request, names, nodes, ledger)
        fits = known.fits.get

        def raw(name: str) -> float | None:
            if name in again:
                verdict, score = again[name]
                return score if verdict.fits else None
            return fits(name)

        if not self.decider.relative:
            if not again:
                tens = list(map(known.tens.get, names, repeat(0)))
            else:
                tens = [
                    absolute(again[n][1]) if n in again else known.tens.get(n, 0) for n in names
                ]
        elif not again:
            tens = normalized(list(map(fits, names)))
        else:
            tens = normalized(list(map(raw, names)))
        return single_top(names, tens, raw if again else fits)

    def top_name(
        self,
        request: PodRequest,
        names: Sequence[str],
        nodes: NodeTable,
        ledger: Ledger,
        *,
        scores: Sequence[float] | None = None,
    ) -> str:
        """The node ``prioritize_names`` would put alone on top of ``names``, without scoring
        every node: the best raw score among those that fit, then the first name in sort
        order (``single_top``'s rule; 0..10 scores only round the raw ones, so the top of
        those holds the best raw score). Empty when none fits.

        For the filter's one-node answer, right after ``filter_names`` for the same request
        over a superset of ``names``: it neither reads the pod again, nor lets the policy catch
        up, nor looks for undecided names, as nothing has changed in between (a name found
        undecided all the same counts as not fitting: never a node nobody checked).
        ``scores`` are the filter's raw scores of ``names`` (``NamesResult.scores``), read
        on its way; without them each name is looked up again.
        """
        known = self.decisions.caught_up(request, nodes, ledger)
        again = self.decisions.rebinding(request, names, nodes, ledger)
        fits = known.fits
        if not again and scores is not None and len(scores) == len(names):
            if not scores:
                return ""
            return min(compress(names, map(eq, scores, repeat(max(scores)))))
        if not again:  # the usual case: the same rule as below, in passes that run in C
            raws = list(map(fits.get, names))
            if None in raws:  # names that do not fit are left out
                names = [n for n, raw in zip(names, raws, strict=True) if raw is not None]
                raws = [raw for raw in raws if raw is not None]
            if not raws:
                return ""
            scores = cast(list[float], raws)
            return min(compress(names, map(eq, scores, repeat(max(scores)))))
        best: float | None = None
        winner = ""
        for name in names:
            if name in again:
                verdict, score = again[name]
                raw = score if verdict.fits else None
            else:
                raw = fits.get(name)
            if raw is None:
                continue
            if best is None or raw > best or (raw == best and name < winner):
                best, winner = raw, name
        return winner

    def verdict(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> Verdict:
        """Filter one node, leaving the pod's own earlier holding out of the count.

        ``cluster``, here and in the other calls, is every node of the cluster (the state's
        ``nodes``), for a policy that weighs cluster-wide supply; None: the nodes the calls
        were asked about."""
        self._survey(ledger, table=cluster, shown=(node,))
        return self.decisions.on_node(request, node, ledger)[0]

    def filter(
        self,
        pod: KubeObject,
        nodes: Iterable[NodeInventory],
        ledger: Ledger,
        *,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> FilterResult:
        """Verdicts for every node; an invalid pod fails everywhere with its reasons."""
        request = self._asked(pod)
        nodes = list(nodes)
        if isinstance(request, Rejection):
            verdicts = tuple(refusal(n.name, Code.UNRESOLVABLE, request.reasons) for n in nodes)
            return FilterResult(request=request, verdicts=verdicts)
        if not request.wants_gpu:
            return FilterResult(
                request=request,
                verdicts=tuple(Verdict(node=n.name) for n in nodes),
            )
        self._survey(ledger, table=cluster, shown=nodes)
        return FilterResult(
            request=request,
            verdicts=tuple(v for v, _ in self.decisions.on_nodes(request, nodes, ledger)),
        )

    def score(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        verdict: Verdict | None = None,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> float:
        """The policy's liking in [0, 1]; 0 for nodes that do not fit.

        ``verdict`` may pass this node's filter verdict computed on the same ledger state.
        """
        if not request.wants_gpu or (verdict is not None and not verdict.fits):
            return 0.0
        self._survey(ledger, table=cluster, shown=(node,))
        return self.decisions.on_node(request, node, ledger)[1]

    def prioritize(
        self,
        pod: KubeObject,
        nodes: Iterable[NodeInventory],
        ledger: Ledger,
        *,
        request: PodRequest | Rejection | None = None,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> dict[str, int]:
        """Extender scores 0..10 per node.

        A ``ChoosingPolicy``'s scores are normalised over the nodes given: the best fitting node
        gets 10, the worst 0, linearly between (floored, so only the best get 10); otherwise
        sigmoid values of nearby growths would all round to the same integer. Either way one
        node alone keeps the top score (``single_top``).
        ``request`` may pass the pod's request when the caller has already read it.
        """
        if request is None:
            request = self._asked(pod)
        nodes = list(nodes)
        if isinstance(request, Rejection) or not request.wants_gpu:
            return {n.name: 0 for n in nodes}
        self._survey(ledger, table=cluster, shown=nodes)
        decided: list[Decision] = self.decisions.on_nodes(request, nodes, ledger)
        names = [n.name for n in nodes]
        raw = {n: s if v.fits else None for n, (v, s) in zip(names, decided, strict=True)}
        if not self.decider.relative:
            tens = [absolute(s) for _, s in decided]
        else:
            tens = normalized(list(raw.values()))
        return dict(zip(names, single_top(names, tens, raw.get), strict=True))

    def reserve(
        self,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        cluster: Mapping[str, NodeInventory] | None = None,
        now_ns: int = 0,
    ) -> Booking:
        """Choose GPUs and book them in the ledger; refused with the filter's status when the
        pod no longer fits (then nothing is booked).

        Check and booking happen with no I/O between them, so callers running on one event
        loop cannot double-book.
        """
        verdict = self.verdict(request, node, ledger, cluster=cluster)
        if not verdict.fits:
            return Booking(None, verdict.status)
        allocation = plan(
            request, node=node.name, indexes=verdict.gpus, unit=node.unit, assume_time_ns=now_ns
        )
        ledger.assume(allocation, request.host)
        return Booking(allocation)

    def reserve_pod(
        self,
        pod: KubeObject,
        request: PodRequest,
        node: NodeInventory,
        ledger: Ledger,
        *,
        book: PolicyBook | None,
        cluster: Mapping[str, NodeInventory] | None = None,
        now_ns: int = 0,
    ) -> Reservation:
        """Reserve the pod on ``node`` in every booking store, as kube-scheduler's Reserve
        does: its ResourcePolicy unit (``core.resourcepolicies.policyplugin``), then its GPUs
        (``reserve``); refused with the unit's status, or the verdict's when the GPUs no
        longer fit.

        All or nothing: when the GPUs fail after the unit was assumed, the unit is given back
        before this returns. Idempotent: reserving a pod again replaces its bookings (each
        store holds one per pod, and a pod's own booking is left out of its checks), so it
        still holds one place in its unit and one set of GPUs. ``unreserve`` undoes it.
        """
        unit = reserve_unit(book, pod, node.name, now_s=now_ns / 1e9)
        if not unit.status.ok:
            return Reservation(unit, None, unit.status)
        if not request.wants_gpu:
            return Reservation(unit, None)
        booked = self.reserve(request, node, ledger, cluster=cluster, now_ns=now_ns)
        if booked.allocation is None:
            unreserve_unit(book, request.uid)  # a part-way reserve leaves nothing behind
            status = booked.status
            why = f"pod {key_of(pod)} no longer fits node {node.name}: {status.message}"
            return Reservation(unit, None, Status(status.code, (why,), status.source))
        return Reservation(unit, booked.allocation)

    def unreserve(
        self,
        uid: str,
        ledger: Ledger,
        *,
        kept: Kept | None = None,
        book: PolicyBook | None = None,
    ) -> None:
        """Give back a reservation in every booking store: the GPUs in the ledger and, with
        ``book``, the ResourcePolicy unit (``core.resourcepolicies.policyplugin``). As the
        framework asks of Unreserve, it is idempotent and safe after a reserve that stopped
        part-way: each store drops what it holds for the pod, if anything
        (``tests/unit/core/resourcepolicies/test_reserve.py``).

        ``kept`` is the booking the pod held before this bind booked over it (``Ledger.kept``:
        an earlier bind's, whose outcome was unknown); it comes back instead of nothing, since
        that earlier binding may yet land, or have landed, with its GPUs.
        """
        ledger.unassume(uid)
        if kept is not None:
            ledger.assume(kept.allocation, kept.host)
        unreserve_unit(book, uid)

    def intend(
        self,
        pod: KubeObject,
        names: Sequence[str],
        scores: Sequence[int],
        nodes: Mapping[str, NodeInventory],
        ledger: Ledger,
        *,
        until_ns: int,
        booked_ns: int | None = None,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> Allocation | None:
        """Book, as an intent, the GPUs that the top of a prioritize answer promises.

        kube-scheduler takes the extender's single top node (``schedconfig.packing_profile``)
        and filters the next pod before this pod's bind arrives; the intent makes that pod
        see the share as taken (``Ledger.intend``). It is booked only where the pod fits now,
        never over the pod's own bind booking, and it replaces the pod's earlier intent. The
        node that gets it is the first with the highest score (``single_top`` leaves one).
        """
        request = self._read_asked(pod)
        if not isinstance(request, PodRequest):
            return None
        top = max(scores, default=0)
        name = next((n for n, v in zip(names, scores, strict=True) if v == top), "")
        return self.intend_on(
            request,
            name if top > 0 else "",
            nodes,
            ledger,
            until_ns=until_ns,
            booked_ns=booked_ns,
            cluster=cluster,
        )

    def intend_on(
        self,
        request: PodRequest,
        name: str,
        nodes: Mapping[str, NodeInventory],
        ledger: Ledger,
        *,
        until_ns: int,
        booked_ns: int | None = None,
        cluster: Mapping[str, NodeInventory] | None = None,
    ) -> Allocation | None:
        """Book the pod's GPUs on the named node as an intent (see ``intend``); no node name
        or a node where the pod no longer fits gives back the pod's earlier intent instead."""
        if not request.wants_gpu or not request.uid:
            return None
        uid = request.uid
        if ledger.is_assumed(uid) and ledger.intent_until(uid) is None:
            return None  # its bind has booked: that booking stands
        node = nodes.get(name) if name else None
        verdict = self.verdict(request, node, ledger, cluster=cluster) if node is not None else None
        if node is None or verdict is None or not verdict.fits:
            self.drop_intent(uid, ledger)
            return None
        allocation = plan(request, node=node.name, indexes=verdict.gpus, unit=node.unit)
        ledger.intend(allocation, request.host, until_ns=until_ns, booked_ns=booked_ns)
        return allocation

    def drop_intent(self, uid: str, ledger: Ledger) -> bool:
        """Give back the pod's intent, if it holds one (a new attempt, or a bind that failed);
        whether it held one."""
        if ledger.intent_until(uid) is None:
            return False
        ledger.unassume(uid)
        return True


_is_score = partial(is_not, None)
"""Whether a name's looked-up score says it fits (a score of 0.0 does; None does not)."""


def _within(found: Mapping[str, str], wanted: set[str]) -> dict[str, str]:
    """The entries of ``found`` whose names are in ``wanted``: a copy when all are (every node
    asked about, as kube-scheduler does by default), else the intersection."""
    if found.keys() <= wanted:
        return dict(found)
    return {n: found[n] for n in found.keys() & wanted}
