"""What the device plugin advertises to kubelet: one device per memory unit or percent per GPU.

Memory is advertised as one device per memory unit per GPU (``<uuid>-mem-<k>``), computing power
as one device per percent per GPU (``<uuid>-core-<k>``, 100 per GPU) on core_mem nodes. One device
per unit of the resource as users write it is forced by kubelet: it asks a plugin for exactly as
many device IDs as the container's limit (kubernetes/kubernetes
pkg/kubelet/cm/devicemanager/manager.go, ``allocateContainerResources``), so a 30 % container
names 30 devices, and node capacity (the number of healthy devices) reads 100 per GPU, as ACK
shows it. The device IDs are tokens for kubelet's counting only: which GPU a container really
gets comes from its pod's allocation, found through the hand-off invariant (core.records.handoff),
and is put into the container's environment (deviceplugin.answering).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare.core.model.inventory import CORE_PER_GPU
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM
from gpushare.node.gpus import GpuInfo, mem_units

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class DeviceEntry:
    """One advertised device."""

    id: str
    healthy: bool


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
