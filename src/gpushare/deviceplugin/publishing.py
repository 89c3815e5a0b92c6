"""What the scheduler reads from the node: its GPUs, the memory unit, the hand-off marker.

The extender does not talk to device plugins; it reads the node. The plugin writes the per-GPU
inventory (index, UUID, model, memory in units, health) as ``gpushare.io/gpus``, the unit as
``gpushare.io/gpu-mem-unit``, the marker ``gpushare.io/handoff: podresources`` (this plugin
answers Allocate through the hand-off invariant, so the extender keeps it on this node), and the
GPU count as ``aliyun.com/gpu-count`` in node status. It is written at start and again on every
health change, so an unhealthy GPU stops receiving pods.

It also labels the node the way ACK labels its GPU nodes (``aliyun.accelerator/nvidia_name``,
``nvidia_count``, ``nvidia_mem``, see ``core.gpumodel``), so a pod chooses a model with a plain
nodeSelector and the scarcity policy reads the same model the selector names.
"""

from __future__ import annotations

from gpushare.core.gpumodel import gpu_node_labels
from gpushare.core.inventory import Gpu, inventory_annotation
from gpushare.core.names import ANN_NODE_GPUS, ANN_NODE_HANDOFF, ANN_NODE_UNIT, HANDOFF_PODRESOURCES
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.gpus import GpuSource
from gpushare.deviceplugin.serving import mem_units
from gpushare.kube.port import KubeAPI


async def publish(api: KubeAPI, source: GpuSource, config: PluginConfig) -> None:
    """Write the inventory, unit, hand-off marker and model labels on the node, and gpu-count
    in status."""
    found = source.gpus()
    gpus = tuple(
        Gpu(
            index=g.index,
            mem_units=mem_units(g, config.unit),
            healthy=g.healthy,
            uuid=g.uuid,
            model=g.model,
        )
        for g in found
    )
    await api.patch_node(
        config.node,
        annotations={
            ANN_NODE_GPUS: inventory_annotation(gpus),
            ANN_NODE_UNIT: config.unit.value,
            ANN_NODE_HANDOFF: HANDOFF_PODRESOURCES,
        },
        capacity={config.names.count: str(len(gpus))},
        labels=gpu_node_labels([g.model for g in found], [g.memory_mib for g in found]),
    )
