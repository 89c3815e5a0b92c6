"""What a container is handed for its share: environment, CDI devices, device nodes, mounts.

Both node drivers hand a container the same things for the same share, so they compute it here,
once: the device plugin from the signature its Allocate resolved (deviceplugin.answering), the
DRA driver from a claim's allocation results (dra.preparing). Pure: the caller passes the GPUs,
the node's unit and mode, and the hand-off strategy; the isolation hook
(``node.enforcement``) then adds what enforces the share.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Signature
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.hook import ContainerAnswer
from gpushare.node.gpus import GpuInfo, mem_units


def container_answer(
    signature: Signature,
    gpus: Sequence[GpuInfo],
    unit: MemoryUnit,
    mode: Mode,
    handoff: HandOff | None = None,
) -> ContainerAnswer:
    """The environment of a container served by a signature, and what hands it the GPUs: CDI
    devices under cdi-cri, device nodes and the driver's mount under driver-root."""
    by_index = {g.index: g for g in gpus}
    indexes = [i for i, _ in signature.layout]
    mem_layout = signature.layout if signature.resource == MEM else ()
    first = by_index.get(indexes[0]) if indexes else None
    placed = [by_index[i] for i in indexes if i in by_index]
    handoff = handoff or HandOff()
    carries = signature.resource == MEM
    visible, cdi_devices = handoff.answer([g.uuid for g in placed], carries_devices=carries)
    devices, mounts = handoff.host_edits(
        [g.index if g.minor is None else g.minor for g in placed], carries_devices=carries
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
    return ContainerAnswer(envs=envs, mounts=mounts, cdi_devices=cdi_devices, devices=devices)
