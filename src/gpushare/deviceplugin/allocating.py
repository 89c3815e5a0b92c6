"""Answering kubelet's ``Allocate`` for one container, from the pods bound to this node.

kubelet names only device IDs, as many as the container's limit, never the pod. The answer comes
from the hand-off invariant (core.handoff): the unserved containers bound here that ask for that
many devices of the resource share one signature, and that signature says which GPUs and how much
of each the container gets. The isolation hook then adds what enforces it. When the pods cannot
be read, nobody waits for that count, or the candidates disagree, the answer is a refusal with
the reason, which kubelet shows on the pod: a guess could hand one pod another's GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpushare.core.allocation import Allocation, from_pod
from gpushare.core.handoff import pending_of, resolve
from gpushare.core.ledger import is_terminal
from gpushare.deviceplugin.checkpoint import ServedCheckpoint
from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.deviceplugin.gpus import GpuSource
from gpushare.deviceplugin.serving import (
    ContainerAnswer,
    IsolationError,
    IsolationHook,
    Target,
    container_answer,
)
from gpushare.kube.port import KubeAPI, KubeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refused:
    """Why a container cannot be served; kubelet gets it as the Allocate error."""

    reason: str


async def bound_allocations(api: KubeAPI, node: str) -> list[Allocation]:
    """Allocations of the live pods bound to this node, from the API."""
    pods, _ = await api.list_pods(node)
    allocations = (from_pod(pod) for pod in pods if not is_terminal(pod))
    return [a for a in allocations if a is not None and a.node == node]


class Allocator:
    """Serves one container at a time; the mode is the node's, known once the plugin starts."""

    def __init__(
        self,
        *,
        api: KubeAPI,
        source: GpuSource,
        config: PluginConfig,
        hook: IsolationHook,
        checkpoint: ServedCheckpoint,
        stats: Stats,
    ) -> None:
        self.api = api
        self.source = source
        self.config = config
        self.hook = hook
        self.checkpoint = checkpoint
        self.stats = stats
        self.mode = "share"

    async def allocate(self, resource: str, device_ids: list[str]) -> ContainerAnswer | Refused:
        """Answer one container's request for these device IDs of a resource."""
        count = len(device_ids)
        try:
            pending = pending_of(await bound_allocations(self.api, self.config.node))
        except KubeError as err:
            self.stats.refused += 1
            return Refused(f"gpushare: cannot read the pods bound to {self.config.node}: {err}")
        answer = resolve(resource, count, pending)
        if answer.signature is None:
            self.stats.refused += 1
            log.warning(
                "resource=%s count=%d phase=allocate refused: %s", resource, count, answer.error
            )
            return Refused(f"gpushare: {answer.error}")
        target = Target(answer.signature, self.mode, answer.candidates, tuple(device_ids))
        try:
            result = self.hook.extend(
                container_answer(answer.signature, self.source.gpus(), self.config.unit, self.mode),
                target,
            )
        except IsolationError as err:
            self.stats.refused += 1
            log.error("resource=%s count=%d phase=allocate isolation: %s", resource, count, err)
            return Refused(f"gpushare: {err}")
        self.checkpoint.remember(device_ids, answer.signature)
        self.stats.allocations += 1
        return result
