"""The extender's autoscaling loop: placeholder pods and the scale-down guard, written.

Every ``period_s`` the replica whose kube-scheduler leads (the Lease kube-scheduler holds in
the release namespace names it: ``<pod name>_<uuid>``) asks the core what the autoscalers
need to see (``core.autoscaling``) and writes it:

- placeholders: create each planned one, then mark it ``PodScheduled=False/Unschedulable``
  through the status subresource (a scheduler's mark, which nobody else will write, since
  no scheduler serves it); delete the ones whose pods bound, went or outgrew them;
- the guard: on each GPU node whose GPUs are used or whose pods fit nowhere else GPU by GPU,
  the two autoscalers' opt-out annotations and gpushare's marker; off again when neither
  holds (only where gpushare's marker is: an operator's own opt-out stays). At most
  ``writes_per_round`` node writes a round, so a thousand nodes changing at once cost a
  bounded rate.

The other replica does nothing: it would decide from the same watch and fight over the same
pods. Without a Lease (one replica, leader election off) the one replica acts. Every write
that fails is logged and tried again in the next round; the loop never stops on one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpushare.core.autoscaling.placeholders import (
    Placeholder,
    PlaceholderSettings,
    is_placeholder,
    mark_status,
    plan,
    read_placeholder,
)
from gpushare.core.autoscaling.scaledown import (
    ANN_GUARD,
    CA_SCALE_DOWN_DISABLED,
    KARPENTER_DO_NOT_DISRUPT,
    THRESHOLD,
    guards,
)
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.extender.events import WAITING_FOR_NODE, EventRecorder, PodRef
from gpushare.extender.leadership import Leadership
from gpushare.kube.port import KubeAPI, KubeError, NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AutoscalingSettings:
    """The chart's ``autoscaling`` values, as the extender's flags carry them."""

    placeholders: PlaceholderSettings | None
    """None: no placeholders."""
    guard: bool = True
    threshold: float = THRESHOLD
    lease: str = ""
    """The kube-scheduler Lease in the placeholders' namespace; empty: always lead."""
    identity: str = ""
    """This replica's pod name (kube-scheduler's holder identity starts with it)."""
    lease_namespace: str = ""
    period_s: float = 5.0
    guard_every: int = 6
    """The guard is decided every this many rounds (30 s): an autoscaler waits 10 minutes
    (``--scale-down-unneeded-time``) before it removes a node, and deciding every GPU node costs
    about 36 ms at 1,000 nodes on the event loop (``benchmarks/autoscaling_round.py``)."""
    writes_per_round: int = 50


@dataclass
class Round:
    """What one round did (for logs and tests)."""

    led: bool = False
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    guarded: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)


class Autoscaling:
    """Keeps the placeholders and the guard in line with the state, in the leading replica."""

    def __init__(
        self,
        *,
        api: KubeAPI,
        state: ClusterState,
        settings: AutoscalingSettings,
        clock_ns: Callable[[], int] = time.time_ns,
        events: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.events = events
        """Where each pod a new placeholder stands for is told it waits for a new node."""
        self.state = state
        self.settings = settings
        self.clock_ns = clock_ns
        self._marked: set[str] = set()
        """Placeholders this process marked (after a restart each is marked again, once)."""
        self._told: dict[str, str] = {}
        self._rounds = 0
        self._quiet: dict[str, int] = {}
        """Pods a placeholder stands for, pending and not refused: since when."""

    async def run(self) -> None:
        """Forever: a round every ``period_s``; a failed one is logged."""
        while True:
            try:
                await self.round()
            except Exception:
                log.exception(
                    "autoscaling round failed; trying again in %ss", self.settings.period_s
                )
            await asyncio.sleep(self.settings.period_s)

    async def leading(self) -> bool:
        """Whether this replica's kube-scheduler holds the Lease (True without one)."""
        s = self.settings
        return await Leadership(s.lease, s.lease_namespace, s.identity).leading(self.api)

    async def round(self) -> Round:
        """One round: lead or do nothing; then placeholders, then the guard."""
        done = Round()
        if not await self.leading():
            return done
        done.led = True
        if self.settings.placeholders is not None:
            await self._placeholders(self.settings.placeholders, done)
        if self.settings.guard and self._rounds % max(self.settings.guard_every, 1) == 0:
            await asyncio.sleep(0)  # kube-scheduler's calls go first
            await self._guard(done)
        self._rounds += 1
        return done

    async def _placeholders(self, settings: PlaceholderSettings, done: Round) -> None:
        state = self.state
        pending = state.pending
        existing: list[Placeholder] = []
        for pod in list(state.placeholders.values()):
            if is_placeholder(pod, settings.namespace):
                held = read_placeholder(pod)
                existing.append(replace(held, marked=held.uid in self._marked))
        gpu_nodes = [n for n, node in state.nodes.items() if node.gpus]
        now = self.clock_ns()
        standing = {u for held in existing for u in held.covers}
        self._quiet = {
            u: self._quiet.get(u, now)
            for u in standing
            if u in pending and u not in state.shortfalls
        }
        step = plan(
            state.shortfalls,
            pending,
            existing,
            gpu_nodes,
            settings,
            now_ns=now,
            quiet=self._quiet,
        )
        for held in step.delete:
            try:
                await self.api.remove_pod(settings.namespace, held.name, uid=held.uid)
                done.deleted.append(held.name)
                log.info("placeholder %s deleted: its pods bound, went or need another", held.name)
            except NotFound:
                pass
            except KubeError as err:
                log.warning("placeholder %s not deleted (next round): %s", held.name, err)
            self._marked.discard(held.uid)
        for planned in step.create:
            try:
                created = await self.api.add_pod(planned.manifest)
            except KubeError as err:
                log.warning("placeholder %s not created (next round): %s", planned.name, err)
                continue
            done.created.append(planned.name)
            log.info(
                "placeholder %s created for %d GPU(s): %s fit no existing GPU",
                planned.name,
                planned.gpus,
                ", ".join(planned.pods),
            )
            await self._mark(settings, planned.name, str(created["metadata"]["uid"]), planned.pods)
            self._tell(settings, planned.name, planned.covers, planned.gpus)
        by_name = {h.name: h for h in existing}
        for name in step.mark:
            held = by_name[name]
            await self._mark(settings, name, held.uid, ())
        for key, why in step.left.items():
            if self._told.get(key) != why:
                log.info("no placeholder for %s: %s", key, why)
        self._told = dict(step.left)
        done.left = dict(step.left)

    def _tell(
        self, settings: PlaceholderSettings, name: str, covers: tuple[str, ...], gpus: int
    ) -> None:
        """A Normal Event on each pod: ``kubectl describe pod`` says why it waits."""
        if self.events is None:
            return
        for uid in covers:
            pod = self.state.pending.get(uid)
            if pod is None or not self.events.allows("Normal"):
                continue
            self.events.record(
                PodRef.of(pod),
                "Normal",
                WAITING_FOR_NODE,
                f"no existing GPU holds it; placeholder {settings.namespace}/{name} asks the "
                f"autoscaler for a new node ({gpus} GPU(s))",
            )

    async def _mark(
        self, settings: PlaceholderSettings, name: str, uid: str, pods: tuple[str, ...]
    ) -> None:
        try:
            await self.api.patch_pod_status(settings.namespace, name, mark_status(list(pods)))
            self._marked.add(uid)
        except KubeError as err:
            log.warning("placeholder %s not marked Unschedulable (next round): %s", name, err)

    async def _guard(self, done: Round) -> None:
        state = self.state
        verdicts = guards(state.nodes, state.ledger, threshold=self.settings.threshold)
        writes = 0
        for name, guard in sorted(verdicts.items()):
            if writes >= self.settings.writes_per_round:
                break
            marked = name in state.guarded
            if guard.needed and not marked:
                annotations: dict[str, str | None] = {
                    CA_SCALE_DOWN_DISABLED: "true",
                    KARPENTER_DO_NOT_DISRUPT: "true",
                    ANN_GUARD: guard.reason,
                }
                target = done.guarded
            elif not guard.needed and marked:
                annotations = dict.fromkeys(
                    (CA_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT, ANN_GUARD), None
                )
                target = done.released
            else:
                continue
            writes += 1
            try:
                await self.api.patch_node(name, annotations=annotations)
            except KubeError as err:
                log.warning("scale-down guard on node %s not written (next round): %s", name, err)
                continue
            target.append(name)
            # the watch shows it soon; until then, not written twice
            if guard.needed:
                state.guarded[name] = guard.reason
            else:
                state.guarded.pop(name, None)
            log.info(
                "node %s: scale-down %s%s",
                name,
                "guarded: " if guard.needed else "guard lifted",
                guard.reason,
            )
