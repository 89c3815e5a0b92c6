"""What the device plugin advertises and what Allocate answers (pure, no gRPC here).

Memory is advertised as one device per memory unit per GPU (``<uuid>-mem-<k>``), computing power
as one device per percent per GPU (``<uuid>-core-<k>``, 100 per GPU) on core_mem nodes. One device
per unit of the resource as users write it is forced by kubelet: it asks a plugin for exactly as
many device IDs as the container's limit (kubernetes/kubernetes
pkg/kubelet/cm/devicemanager/manager.go, ``allocateContainerResources``), so a 30 % container
names 30 devices, and node capacity (the number of healthy devices) reads 100 per GPU, as ACK
shows it. The device IDs are tokens for kubelet's counting only: which GPU a container really
gets comes from its pod's allocation, found through the hand-off invariant (core.records.handoff),
and is
put into the container's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.core.model.inventory import CORE_PER_GPU, Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Pending, Signature
from gpushare.deviceplugin.cdi import HandOff
from gpushare.deviceplugin.gpus import GpuInfo

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class DeviceEntry:
    """One advertised device."""

    id: str
    healthy: bool


def mem_units(gpu: GpuInfo, unit: MemoryUnit) -> int:
    """Whole memory units a GPU offers."""
    return gpu.memory_mib // unit.mib


def devices(resource: str, gpus: list[GpuInfo], unit: MemoryUnit) -> list[DeviceEntry]:
    """The device list for ListAndWatch; an unhealthy GPU's devices are Unhealthy."""
    out: list[DeviceEntry] = []
    for gpu in gpus:
        if resource == MEM:
            count, tag = mem_units(gpu, unit), "mem"
        else:
            count, tag = CORE_PER_GPU, "core"
        out.extend(DeviceEntry(f"{gpu.uuid}-{tag}-{k}", gpu.healthy) for k in range(count))
    return out


@dataclass(frozen=True)
class ContainerAnswer:
    """The environment and mounts one container gets."""

    envs: Mapping[str, str]
    mounts: tuple[tuple[str, str, bool], ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (``nvidia.com/gpu=<uuid>``) under cdi-cri."""


class IsolationError(Exception):
    """An isolation hook cannot serve a container; Allocate fails with this message."""


@dataclass(frozen=True)
class Target:
    """What one Allocate call serves: the signature, the node's mode, and who may be admitted.

    ``candidates`` are the pending containers sharing the signature; kubelet does not say which
    of them it is admitting, so when there are several the hook must not name one. The device
    IDs are kubelet's, unique among live containers.
    """

    signature: Signature
    mode: Mode
    candidates: tuple[Pending, ...] = ()
    device_ids: tuple[str, ...] = ()
    weight: int = 1
    """cGPU policy 2's weight, from the candidates' pod specs (``ALIYUN_COM_GPU_SCHD_WEIGHT``)."""


class IsolationHook(Protocol):
    """Adds what the isolation layer needs (preload, accounting dir) to a container's answer.

    ``prepare`` runs once when the plugin starts, with the node's mode, and returns why the
    plugin must not start (or ""); ``close`` runs when it stops and must be idempotent.
    """

    def prepare(self, mode: Mode) -> str:
        """Get ready to serve a node of this mode; the reason to refuse, or ""."""
        ...

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Return the answer with the isolation layer's additions."""
        ...

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Drop per-container state of pods not in ``live_uids`` and device sets not in use.

        ``live_devices`` are the sorted memory device IDs of each container kubelet reports.
        Both are snapshots that may predate an Allocate running meanwhile, so state younger than
        a short grace period must be kept.
        """
        ...

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """The container kubelet gave these memory device IDs asks for this cGPU weight.

        Called once PodResources names the pod; Allocate may have had to give the lowest
        weight of several candidates. Idempotent.
        """
        ...

    def close(self) -> None:
        """Release what ``prepare`` and ``extend`` started."""
        ...


class NoIsolation:
    """The default hook: share nodes, and nodes served with ``--isolation none``."""

    def prepare(self, mode: Mode) -> str:
        """Nothing to prepare."""
        return ""

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Leave the answer as it is."""
        return answer

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Nothing kept."""

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """No schedules."""

    def close(self) -> None:
        """Nothing to release."""


def container_answer(
    signature: Signature,
    gpus: list[GpuInfo],
    unit: MemoryUnit,
    mode: Mode,
    handoff: HandOff | None = None,
) -> ContainerAnswer:
    """The environment (and under cdi-cri the CDI devices) of a container served by a signature."""
    by_index = {g.index: g for g in gpus}
    indexes = [i for i, _ in signature.layout]
    mem_layout = signature.layout if signature.resource == MEM else ()
    first = by_index.get(indexes[0]) if indexes else None
    uuids = [by_index[i].uuid for i in indexes if i in by_index]
    visible, cdi_devices = (handoff or HandOff()).answer(
        uuids, carries_devices=signature.resource == MEM
    )
    envs = {
        "NVIDIA_VISIBLE_DEVICES": visible,
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(i) for i in indexes),
        "ALIYUN_COM_GPU_MEM_POD": str(signature.pod_mem_units),
        "ALIYUN_COM_GPU_MEM_DEV": str(mem_units(first, unit) if first else 0),
        "GPUSHARE_MEM_UNIT": unit.value,
        "GPUSHARE_MODE": mode.value,
    }
    if mem_layout:
        envs["ALIYUN_COM_GPU_MEM_CONTAINER"] = str(sum(m for _, m in mem_layout))
        envs["GPUSHARE_MEM_PER_GPU"] = ",".join(f"{i}:{m}" for i, m in mem_layout)
    if signature.core_layout:
        per_gpu = {pct for _, pct in signature.core_layout}
        envs["ALIYUN_COM_GPU_CORE_PERCENTAGE"] = str(max(per_gpu))
        envs["GPUSHARE_CORE_PER_GPU"] = ",".join(f"{i}:{p}" for i, p in signature.core_layout)
    return ContainerAnswer(envs=envs, cdi_devices=cdi_devices)
