"""Answering kubelet's ``Allocate`` for one container, from the pods bound to this node.

kubelet names only device IDs, as many as the container's limit, never the pod. The answer comes
from the hand-off invariant (core.records.handoff): the unserved containers bound here that ask
for that many devices of the resource share one signature, and that signature says which GPUs and
how much of each the container gets. The isolation hook then adds what enforces it. When the
pods cannot be read, nobody waits for that count, or the candidates disagree, the answer is a
refusal with the reason, which kubelet shows on the pod: a guess could hand one pod another's GPU.

Only allocations gpushare sealed for their pod count (core.records.trust): an untrusted one is never
served, never marked served and takes no part in the hand-off. A pod bound here that asks for
these devices without a trusted allocation and has not started (a *stranger*) may be the pod
kubelet is admitting, so an ``Allocate`` of one of its containers' counts is refused, naming it
(core.records.handoff.resolve). Ignored allocations are counted once per pod and reason.

A refusal because of strangers while pods gpushare placed wait is held back for up to
:data:`STRANGER_WAIT_S`, re-reading the node: kubelet admits one pod at a time, sorted by
creation time, and marks a pod it rejected Failed through its status manager, asynchronously
(kubernetes v1.36.3 ``pkg/kubelet/kubelet.go``: ``HandlePodAdditions`` loops over the pods and
calls ``rejectPod``, which only sets the status). So right after refusing a stranger, kubelet
asks for the next pod, a placed one, before the stranger's Failed phase reaches the API; on the
real kubelet that is the usual case, not a rare one. A stranger seen in a terminal phase is not
the pod being admitted (its admission ended before its status was written), so it no longer
counts; one that merely vanished (force-deleted) still does, since kubelet may still be admitting
it.

The answer itself is computed by a pure function (deviceplugin.answering) from what this module
reads; this module adds what needs the node: the reads, the wait, the CDI specs checked again, the
isolation hook, the checkpoint and the counters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpushare.core.model.inventory import Mode
from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of
from gpushare.core.model.status import Code, Status
from gpushare.core.records.trust import NodeJudge, NodePods, NodeReading, Trust
from gpushare.deviceplugin.answering import (
    Granted,
    NodeFacts,
    Request,
    answer,
    blocking_strangers,
    refusal,
)
from gpushare.deviceplugin.checkpoint import ServedCheckpoint
from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.kube.port import KubeAPI, KubeError
from gpushare.node.enforcement.hook import ContainerAnswer, IsolationError, IsolationHook
from gpushare.node.gpus import GpuSource

log = logging.getLogger(__name__)

STRANGER_WAIT_S = 2.0
"""How long a refusal caused by strangers waits for them to be seen Failed (see above)."""
STRANGER_POLL_S = 0.1


class NodeReader:
    """Reads and judges the pods bound to this node; counts ignored allocations once each."""

    def __init__(self, *, api: KubeAPI, config: PluginConfig, trust: Trust, stats: Stats) -> None:
        self.api = api
        self.config = config
        self.trust = trust
        self.stats = stats
        self._judge = NodeJudge(trust, config.names, node=config.node)
        self.finished: frozenset[str] = frozenset()
        """UIDs of this node's pods in a terminal phase, as of the last read."""
        self.by_uid: Mapping[str, KubeObject] = {}
        """This node's pods by UID, as of the last read (their specs give cGPU weights)."""

    async def read(self) -> NodePods:
        """The live pods bound to this node, from the API, judged (raises KubeError).

        A list, not the watch's store: Allocate answers for a pod kubelet has just seen bound,
        which the watch may not have shown yet, and a refusal fails the pod for good.
        """
        pods, _ = await self.api.list_pods(self.config.node)
        reading = self._told(self._judge.read(pods))
        self.by_uid, self.finished = reading.by_uid, reading.finished
        return reading.pods

    def judge(self, pods: Sequence[KubeObject]) -> NodePods:
        """These pods of this node (listed, or the watch's), judged."""
        return self._told(self._judge.read(pods)).pods

    def _told(self, reading: NodeReading) -> NodeReading:
        """Count and log the allocations the reading ignores for the first time."""
        for pod, why in reading.reports:
            reason = why.reason.value
            self.stats.untrusted[reason] = self.stats.untrusted.get(reason, 0) + 1
            key = f"{namespace_of(pod)}/{name_of(pod)}"
            log.warning("pod=%s phase=trust allocation ignored: %s", key, why.message)
        return reading


@dataclass(frozen=True)
class NodeParts:
    """What answering Allocate and checking served pods both work with, on one node."""

    api: KubeAPI
    config: PluginConfig
    hook: IsolationHook
    checkpoint: ServedCheckpoint
    stats: Stats
    pods: NodeReader
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the node's pods may have changed in PodResources: the watch showed a change of
    a pod bound here, or Allocate answered; the served check waits on it (reconcile)."""


class OnNode:
    """A worker of the plugin holding the node's shared parts as its own attributes."""

    def __init__(self, parts: NodeParts) -> None:
        self.api = parts.api
        self.config = parts.config
        self.hook = parts.hook
        self.checkpoint = parts.checkpoint
        self.stats = parts.stats
        self.pods = parts.pods
        self.changed = parts.changed


class Allocator(OnNode):
    """Serves one container at a time; the mode is the node's, known once the plugin starts."""

    def __init__(self, parts: NodeParts, *, source: GpuSource) -> None:
        super().__init__(parts)
        self.source = source
        self.mode = Mode.SHARE

    async def allocate(self, resource: str, device_ids: list[str]) -> ContainerAnswer | Status:
        """Answer one container's request for these device IDs of a resource."""
        request = Request(resource, tuple(device_ids))
        count = len(device_ids)
        try:
            bound = await self.pods.read()
        except KubeError as err:
            self.stats.refused += 1
            return refusal(Code.ERROR, f"cannot read the pods bound to {self.config.node}: {err}")
        node = NodeFacts(
            gpus=tuple(self.source.gpus()),
            mode=self.mode,
            unit=self.config.unit,
            handoff=self.config.handoff,
            max_pods=self.config.max_pods,
        )
        decided = answer(request, bound, self.pods.by_uid, node)
        suspects = blocking_strangers(request, bound) if isinstance(decided, Status) else None
        if suspects:
            try:
                again = await self._without_rejected(suspects)
            except KubeError as err:
                log.warning("resource=%s count=%d phase=allocate re-read: %s", resource, count, err)
            else:
                if again is not None:
                    decided = answer(request, again, self.pods.by_uid, node)
                    log.info(
                        "resource=%s count=%d phase=allocate strangers rejected by kubelet: %s",
                        resource,
                        count,
                        decided.message if isinstance(decided, Status) else "served",
                    )
        if isinstance(decided, Status):
            self.stats.refused += 1
            log.warning(
                "resource=%s count=%d phase=allocate refused: %s",
                resource,
                count,
                decided.message,
            )
            return decided
        return self._serve(request, decided)

    def _serve(self, request: Request, granted: Granted) -> ContainerAnswer | Status:
        """Check the node's CDI specs again, let the hook enforce the answer, remember it."""
        resource, count = request.resource, len(request.device_ids)
        for note in granted.notes:
            log.warning("%s", note)
        # the toolkit may rewrite the specs; a driver may be unloaded
        reason = self.config.handoff.refusal(granted.uuids, granted.minors)
        if reason is not None:
            self.stats.refused += 1
            log.error("resource=%s count=%d phase=allocate hand-off: %s", resource, count, reason)
            return refusal(Code.ERROR, reason)
        try:
            result = self.hook.extend(granted.answer, granted.target)
        except IsolationError as err:
            self.stats.refused += 1
            log.error("resource=%s count=%d phase=allocate isolation: %s", resource, count, err)
            return refusal(Code.ERROR, str(err))
        self.checkpoint.remember(list(request.device_ids), granted.target.signature)
        self.stats.allocations += 1
        self.changed.set()
        return result

    async def _without_rejected(self, suspects: frozenset[str]) -> NodePods | None:
        """The node's pods once the strangers behind a refusal are seen Failed (None: not in
        time, and the refusal stands).

        Only strangers seen in a terminal phase stop counting; new strangers count as usual.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STRANGER_WAIT_S
        while loop.time() < deadline:
            await asyncio.sleep(STRANGER_POLL_S)
            again = await self.pods.read()
            if not suspects <= self.pods.finished:
                continue
            return again
        return None
