"""The answer to one container's ``Allocate``, from what was read: pure, no gRPC, API or files.

kubelet asks for device IDs of a resource and names no pod. Given the node's pods as already read
and judged (core.records.trust), their specs and the node's GPUs, :func:`answer` says what the
container gets (its environment and, under cdi-cri, its CDI devices) and whom it may be, or a
refusal (a ``core.model.status.Status``) with the reason kubelet shows on the pod. What needs
the node itself stays with the caller (deviceplugin.allocating): reading the pods, waiting for
kubelet to reject a stranger, checking the node's CDI specs again, and the isolation hook's
files, sockets and daemons, which add the mounts and annotations that enforce the answer.

cGPU policy 2's weight is read here, from ``ALIYUN_COM_GPU_SCHD_WEIGHT`` in the container's
``env`` in the pod object (isolation.policy.weight_from_env): the process's own environment is
the tenant's to change, the pod spec is not once it is admitted. When the candidates for one
answer ask for different weights, kubelet's silence about which one it admits leaves the lowest
of them, so that no pod is ever given more than its spec asks; a bad value is noted with the
field, value and rule (the caller logs it), and weight 1 is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpushare.core.model.inventory import Mode
from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of, spec_of
from gpushare.core.model.status import Code, Status, refused
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import Pending, pending_of, resolve
from gpushare.core.records.trust import NodePods
from gpushare.isolation.policy import WeightReading, weight_from_env
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.hook import ContainerAnswer, Target
from gpushare.node.gpus import GpuInfo
from gpushare.node.handout import container_answer

SOURCE = "gpushare"
"""Who an Allocate refusal says decided: kubelet shows ``gpushare: <reason>`` on the pod."""


def refusal(code: Code, reason: str) -> Status:
    """Why a container cannot be served; kubelet gets ``Status.attributed`` as the error."""
    return refused(code, reason, SOURCE)


@dataclass(frozen=True)
class Request:
    """One container's ask, as kubelet makes it: device IDs of one resource."""

    resource: str
    device_ids: tuple[str, ...]

    @property
    def count(self) -> int:
        """How many devices: the container's limit of the resource."""
        return len(self.device_ids)


@dataclass(frozen=True)
class NodeFacts:
    """What the answer depends on besides the pods: the node's GPUs and settings."""

    gpus: tuple[GpuInfo, ...]
    mode: Mode
    unit: MemoryUnit
    handoff: HandOff
    """The device-list strategy and CDI kind (only its pure ``answer`` is used here)."""
    max_pods: int
    """The top cGPU weight (the chart's maxPodsPerGpu)."""


@dataclass(frozen=True)
class Granted:
    """A container served: the answer before the isolation hook, and what the hook is told."""

    answer: ContainerAnswer
    target: Target
    uuids: tuple[str, ...]
    """The placed GPUs' UUIDs, which the node's CDI specs must name under cdi-cri."""
    minors: tuple[int | None, ...] = ()
    """Their minor numbers, in the same order, whose device nodes driver-root hands over."""
    notes: tuple[str, ...] = ()
    """Problems with the candidates' cGPU weights, to be logged."""


def spec_weight(pod: KubeObject | None, container: str, max_weight: int) -> WeightReading:
    """A container's cGPU weight as its pod object gives it (1 when the pod is not known)."""
    if pod is None:
        return WeightReading()
    spec = spec_of(pod)
    found = next(
        (
            c
            for c in (*spec.get("initContainers", ()), *spec.get("containers", ()))
            if isinstance(c, dict) and c.get("name") == container
        ),
        {},
    )
    where = f"pod {namespace_of(pod)}/{name_of(pod)} container {container}"
    return weight_from_env(found.get("env"), max_weight=max_weight, where=where)


def weight_of(
    candidates: Sequence[Pending], specs: Mapping[str, KubeObject], max_pods: int
) -> tuple[int, tuple[str, ...]]:
    """The cGPU weight for an answer (the candidates' own, or the lowest when they differ),
    with a note for each bad value and one when they differ."""
    weights = set()
    notes: list[str] = []
    for pending in candidates:
        reading = spec_weight(specs.get(pending.uid), pending.container, max_pods)
        if reading.problem:
            notes.append(f"pod={pending.pod} phase=allocate cgpu weight: {reading.problem}")
        weights.add(reading.weight)
    if len(weights) > 1:
        notes.append(
            "phase=allocate cgpu weight: the pods waiting for this answer ask for weights "
            f"{sorted(weights)}; the lowest is given, since kubelet does not say which pod it "
            "admits"
        )
    return min(weights, default=1), tuple(notes)


def blocking_strangers(request: Request, pods: NodePods) -> frozenset[str]:
    """UIDs of the strangers that keep pods gpushare placed from this answer (empty: none)."""
    settled = resolve(request.resource, request.count, pending_of(pods.allocations), pods.strangers)
    if settled.signature is not None or not settled.candidates:
        return frozenset()
    return frozenset(s.uid for s in pods.strangers if (request.resource, request.count) in s.counts)


def answer(
    request: Request, pods: NodePods, specs: Mapping[str, KubeObject], node: NodeFacts
) -> Granted | Status:
    """What one container gets for these device IDs, from the node's pods as read, or why not.

    ``specs`` are the node's pod objects by UID (their containers' env gives cGPU weights).
    """
    settled = resolve(request.resource, request.count, pending_of(pods.allocations), pods.strangers)
    if settled.signature is None:
        # kubelet shows the plugin's name in front of the reason, not the hand-off's
        return refusal(settled.status.code, settled.status.message)
    weight, notes = weight_of(settled.candidates, specs, node.max_pods)
    placed = {i for i, _ in settled.signature.layout}
    return Granted(
        answer=container_answer(settled.signature, node.gpus, node.unit, node.mode, node.handoff),
        target=Target(
            settled.signature, node.mode, settled.candidates, request.device_ids, weight=weight
        ),
        uuids=tuple(g.uuid for g in node.gpus if g.index in placed),
        minors=tuple(g.minor for g in node.gpus if g.index in placed),
        notes=notes,
    )
