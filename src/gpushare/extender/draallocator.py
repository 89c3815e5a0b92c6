"""DRA mode's allocator (``gpushare extender --dra-allocator``): gated pods' claims, allocated.

The webhook gives every pod it converts to a claim the scheduling gate
``gpushare.io/dra-allocation`` (docs/dra.md), so kube-scheduler leaves it alone until gpushare
has placed it. This loop, in the leading replica only (like the autoscaling loop: the other
replica would decide from the same watches and race for the same claims):

1. follows gpushare's ResourceSlices, every ResourceClaim and the nodes labelled for DRA mode
   (list, then watch; relist on expiry), and takes the gated pods from the extender's own pod
   watch (``take``, fed by ``ClusterCache.run``);
2. for each gated pod whose claim exists (the resourceclaim controller makes it from the
   template and names it in ``pod.status.resourceClaimStatuses``), reads the ledger
   (``core.dra.ledger``: the slices and every allocated claim, booked into the extender's
   ledger beside the bound pods' CPU and memory) and asks ``core.dra.allocate`` for the node
   and GPUs, with the extender's own scheduler core and node policy;
3. allocated: adds the finalizer ``resource.kubernetes.io/delete-protection`` (PUT with the
   claim's resourceVersion), then writes ``status.allocation`` and ``status.reservedFor`` (PUT
   of the status subresource with the new resourceVersion); on Conflict it reads the claim
   again and tries again (a claim allocated meanwhile by someone else is left as it is);
4. removes the gate (JSON patch with a ``test`` of the gates as read) once allocated, or when
   the claim is not gpushare's to place. A pod no node fits now (``Refused``) keeps its gate and
   is decided again every round, told in a Warning Event ``DRANoFit`` each time the reasons
   change: ungated, kube-scheduler's own allocator would take it up as soon as a claim frees
   room, at the same moment as gpushare allocates a gated pod into that room, and neither sees
   the other's write, so the GPU is overcommitted (seen on the real node: the 500-pod stress
   held up to 40 GiB on 32 GiB GPUs). With ``ungate_refused`` (``--dra-ungate-refused``, for
   node pools that cluster-autoscaler grows: it scales only for ungated, unschedulable pods)
   the refused pod is ungated instead, and that race is accepted.

ResourcePolicy (docs/resource-policy.md) orders DRA pods as it orders the extender's: the nodes
that fit are narrowed to the unit the policy opens to the pod (``filter_units``), the chosen
node's unit is assumed in the extender's ``PolicyBook`` before anything is written
(``reserve_unit``, so the next pod of the round counts it), and the unit's ``podLabels``,
``podAnnotations``, policy, unit number and deletion cost are merged into the pod (with its
``resourceVersion``) before the claim is written, so a pod never runs in a unit without saying
which. A pod whose GPUs fit only on nodes the policy keeps it off now stays gated (``Held``:
ungated, the scheduler's first-fit allocator would place it on any node) with a Warning Event
``DRAHeld`` each time the reason changes, and is decided again on every round.

Why the finalizer and the order: pkg/controller/resourceclaim/controller.go (v1.36.3,
``syncClaim``) clears an allocation when its last ``reservedFor`` pod goes only if the claim
carries the finalizer, and kube-scheduler's PreBind adds it before the status for the same
reason: a claim with an allocation and no finalizer could be deleted while in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.decision.clusterstate import ClusterState, PodTaken
from gpushare.core.decision.scheduling import Scheduler
from gpushare.core.dra.allocate import (
    FINALIZER,
    Allocated,
    Held,
    NodeView,
    NotOurs,
    Outcome,
    Refused,
    allocate,
    claim_request,
    read_requests,
)
from gpushare.core.dra.ledger import DraLedger, read_ledger
from gpushare.core.model.kubejson import (
    KubeObject,
    name_of,
    namespace_of,
    node_name_of,
    stored_uid_of,
    uid_of,
)
from gpushare.core.model.names import DRA_CLAIM_NAME, DRA_SCHEDULING_GATE
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.core.resourcepolicies.policyplugin import filter_units, reserve_unit, unreserve_unit
from gpushare.extender.events import EventRecorder, PodRef
from gpushare.kube.mirror import Mirror, key_of
from gpushare.kube.port import Conflict, DraAllocatorAPI, KubeDict, KubeError, NotFound
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)

RETELL_S = 60.0
"""Least seconds between two Events for one gated pod whose reason changed."""
WRITE_TRIES = 3
"""Claim writes tried before the pod waits for the next round (each Conflict reads again)."""


def is_gated(pod: KubeObject) -> bool:
    """Whether the pod is unbound, alive and carries gpushare's DRA gate."""
    if node_name_of(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == DRA_SCHEDULING_GATE for g in gates)


def claim_name(pod: KubeObject) -> str:
    """The name of the pod's gpushare claim: given in the spec, or made by the resourceclaim
    controller from the template and recorded in ``status.resourceClaimStatuses``; empty
    while not made yet."""
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        named = isinstance(entry, Mapping) and entry.get("name") == DRA_CLAIM_NAME
        if named and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if isinstance(entry, Mapping) and entry.get("name") == DRA_CLAIM_NAME:
            return str(entry.get("resourceClaimName") or "")
    return ""


def ungate_operations(pod: KubeObject) -> list[dict[str, Any]]:
    """The JSON patch that removes gpushare's gate, tested against the gates as read (a pod
    whose gates changed meanwhile answers Conflict and is read again)."""
    gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
    rest = [
        g for g in gates if not (isinstance(g, Mapping) and g.get("name") == DRA_SCHEDULING_GATE)
    ]
    test = {"op": "test", "path": "/spec/schedulingGates", "value": gates}
    if rest:
        return [test, {"op": "replace", "path": "/spec/schedulingGates", "value": rest}]
    return [test, {"op": "remove", "path": "/spec/schedulingGates"}]


@dataclass
class Round:
    """What one round did (for logs and tests)."""

    led: bool = False
    allocated: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ungated: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    """Kept gated: their GPUs fit only where a ResourcePolicy keeps them off now."""
    held_anew: list[str] = field(default_factory=list)
    """Of ``held``, those held for the first time or for a new reason (told in ``DRAHeld``)."""
    not_ours: list[str] = field(default_factory=list)


async def _always() -> bool:
    return True


class DraAllocator:
    """Allocates gated pods' claims with gpushare's placement (see the module docstring)."""

    def __init__(
        self,
        *,
        api: DraAllocatorAPI,
        state: ClusterState,
        scheduler: Scheduler,
        events: EventRecorder | None = None,
        leading: Callable[[], Awaitable[bool]] = _always,
        period_s: float = 5.0,
        book: PolicyBook | None = None,
        clock: Callable[[], float] = time.time,
        health: WatchHealth | None = None,
        ungate_refused: bool = False,
    ) -> None:
        self.api = api
        self.ungate_refused = ungate_refused
        """Ungate pods no node fits now, for cluster-autoscaler (see the module docstring)."""
        self.book = book
        """The extender's ResourcePolicy book (None: no policy orders DRA pods)."""
        self.clock = clock
        self.state = state
        self.scheduler = scheduler
        self.events = events
        self.leading = leading
        self.period_s = period_s
        self.wake = asyncio.Event()
        # the extender's WatchHealth: a refused DRA list or watch shows in /readyz and the
        # extender_watch_refused series like the extender's own
        self.slices = Mirror(
            "resourceslices",
            api.list_resource_slices,
            api.watch_resource_slices,
            self.wake,
            health=health,
        )
        self.claims = Mirror(
            "resourceclaims",
            api.list_resource_claims,
            api.watch_resource_claims,
            self.wake,
            health=health,
        )
        self.nodes = Mirror(
            "nodes", api.list_dra_nodes, api.watch_dra_nodes, self.wake, health=health
        )
        self.gated: dict[str, KubeDict] = {}
        """Gated pods by UID, as the extender's pod watch last showed them."""
        self.on_round: Callable[[Round], None] | None = None
        """Told what each round did (the extender's metrics count it)."""
        self._held: dict[str, tuple[str, float]] = {}
        """The last ``DRAHeld`` or ``DRANoFit`` reason told per waiting pod's UID, and when."""
        self._read: tuple[tuple[int, int], DraLedger] | None = None
        """The slices and claims read into a ledger, with the mirrors' revisions it was read at:
        read again only when either changed, not once for every gated pod."""

    def take(self, change: object) -> None:
        """Follow the extender's pod watch (``ClusterCache.run`` hands each change): keep the
        gated pods, drop the others; wake the loop when a gated pod came or share was freed."""
        if not isinstance(change, PodTaken):
            return
        pod = change.pod
        uid = stored_uid_of(pod)
        # a deleted pod's last state may still carry the gate: it must not come back
        if is_gated(pod) and not change.deleted:
            self.gated[uid] = pod
            self.wake.set()
        elif self.gated.pop(uid, None) is not None or change.freed:
            self._held.pop(uid, None)
            self.wake.set()

    async def run(self) -> None:
        """The mirrors and the loop, forever."""
        async with asyncio.TaskGroup() as group:
            for mirror in (self.slices, self.claims, self.nodes):
                group.create_task(mirror.run())
            group.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that comes as the event is set, and the loop would outlive its task group
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period_s):
                    await self.wake.wait()
            self.wake.clear()
            try:
                done = await self.round()
                if self.on_round is not None:
                    self.on_round(done)
            except Exception:
                log.exception("DRA allocation round failed; trying again")

    async def round(self) -> Round:
        """One pass over the gated pods, oldest first, if this replica leads."""
        done = Round()
        if not self.gated or not (self.slices.synced and self.claims.synced and self.nodes.synced):
            return done
        if not await self.leading():
            return done
        done.led = True
        pods = sorted(
            self.gated.values(),
            key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp", "")), key_of(p)),
        )
        for pod in pods:
            await self.place(pod, done)
        return done

    def _outcome(self, pod: KubeDict, claim: KubeDict) -> Outcome:
        """Decide with the ledger as the mirrors and the extender's state show it now."""
        at = (self.slices.revision, self.claims.revision)
        if self._read is not None and self._read[0] == at:
            dra = self._read[1]
        else:
            dra = read_ledger(self.slices.objects.values(), self.claims.objects.values())
            self._read = (at, dra)
            for problem in dra.problems:
                log.warning("dra ledger: claim %s: %s", problem.claim, problem.message)
        ledger = self.state.ledger
        dra.book(ledger)
        by_name = {name_of(n): n for n in self.nodes.objects.values()}
        views = [
            NodeView(
                inventory=dra.inventory(name, by_name[name]),
                node=by_name[name],
                used=ledger.usage(name).host,
                pods=ledger.pods_on(name),
            )
            for name in sorted(dra.nodes)
            if name in by_name
        ]
        cluster = {v.inventory.name: v.inventory for v in views}
        requests = read_requests(claim)
        if isinstance(requests, NotOurs):
            return requests
        workload = self.scheduler.workload
        if workload is not None:  # the fragmentation-aware policies learn DRA pods too
            workload.count(uid_of(pod), claim_request(pod, requests, self.scheduler.settings.unit))
        return allocate(
            pod,
            claim,
            views,
            ledger,
            self.scheduler,
            unit=self.scheduler.settings.unit,
            cluster=cluster,
            requests=requests,
            narrow=self._narrow if self.book is not None else None,
        )

    def _narrow(self, pod: KubeObject, fitting: list[str], failed: dict[str, str]) -> list[str]:
        """ResourcePolicy's filter over the nodes that fit (``core.dra.allocate.Narrowing``)."""
        unresolvable: dict[str, str] = {}
        book = self.book
        labels = book.node_labels if book is not None else {}
        kept = filter_units(book, pod, fitting, failed, unresolvable, labels, now_s=self.clock())
        failed.update(unresolvable)
        return kept

    async def place(self, pod: KubeDict, done: Round) -> None:
        """Allocate one gated pod's claim (or find it cannot be now), then ungate it."""
        key = key_of(pod)
        name = claim_name(pod)
        claim = self.claims.objects.get(f"{namespace_of(pod)}/{name}") if name else None
        if claim is None:
            done.waiting.append(key)  # the controller has not made the claim yet
            return
        status = claim.get("status") or {}
        if not status.get("allocation"):
            outcome = self._outcome(pod, claim)
            if isinstance(outcome, Allocated):
                held = await self._reserve_unit(pod, outcome.node)
                if held is not None:
                    self._hold(pod, held, done)
                    return
                written = await self._write(pod, claim, outcome)
                if written is None:
                    unreserve_unit(self.book, uid_of(pod))
                    done.waiting.append(key)
                    return
                done.allocated.append(key)
                self._tell(pod, "Normal", "DRAAllocated", _where(claim, outcome))
            elif isinstance(outcome, Held):
                self._hold(pod, outcome.message, done)
                return
            elif isinstance(outcome, Refused):
                if not self.ungate_refused:
                    self._hold(pod, outcome.message, done, reason="DRANoFit")
                    return
                done.refused.append(key)
                self._tell(pod, "Warning", "DRANoFit", outcome.message[:1000])
            else:
                done.not_ours.append(key)
                log.info("pod %s: %s; left to kube-scheduler", key, outcome.reason)
        if await self._ungate(pod):
            done.ungated.append(key)
            self.gated.pop(stored_uid_of(pod), None)
            self._held.pop(stored_uid_of(pod), None)

    async def _reserve_unit(self, pod: KubeDict, node: str) -> str | None:
        """Assume the pod in its ResourcePolicy unit on ``node`` and write the unit's marks on
        the pod (``reserve_unit``: the same as bind writes in device-plugin mode). None when
        done (or no policy orders the pod); else why the pod waits: the unit closed, or the
        pod changed before its marks were written (the next round reads it again)."""
        unit = reserve_unit(self.book, pod, node, now_s=self.clock())
        if not unit.status.ok:
            return unit.status.message
        if not unit.annotations and not unit.labels:
            return None
        version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
        try:
            await self.api.patch_pod_annotations(
                namespace_of(pod),
                name_of(pod),
                unit.annotations,
                resource_version=version,
                labels=unit.labels,
            )
        except KubeError as err:
            unreserve_unit(self.book, uid_of(pod))
            log.info("pod %s: ResourcePolicy marks not written (%s); next round", key_of(pod), err)
            return ""
        return None

    def _hold(self, pod: KubeDict, why: str, done: Round, *, reason: str = "DRAHeld") -> None:
        """Keep the pod gated; tell why once per reason (empty: a write to try again). A pod
        no node fits (``DRANoFit``) counts as refused when told, else as waiting."""
        key, uid = key_of(pod), stored_uid_of(pod)
        if not why:
            done.waiting.append(key)
            return
        last = self._held.get(uid)
        # told again when the reason changed, at most once a RETELL_S: a refusal's per-node
        # reasons move with every pod placed or gone, and Warnings are never rate-limited
        told = last is not None and (last[0] == why or self.clock() - last[1] < RETELL_S)
        if reason == "DRANoFit":
            (done.waiting if told else done.refused).append(key)
        else:
            done.held.append(key)
            if not told:
                done.held_anew.append(key)
        if not told:
            self._held[uid] = (why, self.clock())
            self._tell(pod, "Warning", reason, why[:1000])

    async def _write(self, pod: KubeDict, claim: KubeDict, outcome: Allocated) -> KubeDict | None:
        """Finalizer, then status, each with the claim's version; on Conflict read again. None
        when it did not land (the pod stays gated for the next round)."""
        current: KubeDict = claim
        for _ in range(WRITE_TRIES):
            try:
                if (current.get("status") or {}).get("allocation"):
                    return None  # allocated meanwhile: the next round sees it
                finalizers = list((current.get("metadata") or {}).get("finalizers") or [])
                if FINALIZER not in finalizers:
                    current = await self.api.replace_resource_claim(
                        {
                            **current,
                            "metadata": {
                                **current["metadata"],
                                "finalizers": [*finalizers, FINALIZER],
                            },
                        }
                    )
                written = await self.api.replace_resource_claim_status(
                    {**current, "status": {**(current.get("status") or {}), **outcome.status}}
                )
                self.claims.put(written)
                self.state.ledger.claim(outcome.allocation)
                return written
            except Conflict:
                try:
                    current = await self.api.get_resource_claim(namespace_of(claim), name_of(claim))
                except NotFound:
                    return None
            except KubeError as err:
                log.warning("claim %s: %s", key_of(claim), err)
                return None
        return None

    async def _ungate(self, pod: KubeDict) -> bool:
        try:
            await self.api.patch_pod_json(namespace_of(pod), name_of(pod), ungate_operations(pod))
        except NotFound:
            return True
        except KubeError as err:  # Conflict included: the watch brings the pod as it is now
            log.info("pod %s: gate not removed (%s); next round", key_of(pod), err)
            return False
        return True

    def _tell(self, pod: KubeDict, kind: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(
                PodRef.of(pod), "Warning" if kind == "Warning" else "Normal", reason, message
            )


def _where(claim: KubeDict, outcome: Allocated) -> str:
    shares = ", ".join(
        f"GPU{s.index} {outcome.allocation.unit.describe(s.mem_units)}"
        + (f" {s.core_pct}%" if s.core_pct else "")
        for s in outcome.allocation.gpus
    )
    return f"claim {key_of(claim)} allocated on node {outcome.node}: {shares}"
