"""What the scheduler reads from the node: its GPUs, the memory unit, the hand-off marker.

The extender does not talk to device plugins; it reads the node. The plugin writes the per-GPU
inventory (index, UUID, model, memory in units, health) as ``gpushare.io/gpus``, the unit as
``gpushare.io/gpu-mem-unit``, the marker ``gpushare.io/handoff: podresources`` (this plugin
answers Allocate through the hand-off invariant, so the extender keeps it on this node), and the
GPU count as ``aliyun.com/gpu-count`` in node status. It is written at start and again on every
health change, so an unhealthy GPU stops receiving pods.

It also labels the node the way ACK labels its GPU nodes (``aliyun.accelerator/nvidia_name``,
``nvidia_count``, ``nvidia_mem``, see ``core.model.gpumodel``), so a pod chooses a model with a
plain
nodeSelector and the scarcity policy reads the same model the selector names.

How the GPUs are connected goes beside the inventory as ``gpushare.io/gpu-topology``
(``core.model.topology``'s format, written by its encoder), only when it differs from what the node
holds: it is fixed while the plugin runs, so the health changes that republish the inventory
leave it alone, and a backend that knows no topology removes a stale one rather than let the
scheduler read links the node no longer has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpushare.core.model.gpumodel import gpu_node_labels
from gpushare.core.model.inventory import Gpu, inventory_annotation
from gpushare.core.model.names import (
    ANN_NODE_GPUS,
    ANN_NODE_HANDOFF,
    ANN_NODE_TOPOLOGY,
    ANN_NODE_UNIT,
    HANDOFF_PODRESOURCES,
    LABEL_NODE_GPUS_PUBLISHED,
    ResourceNames,
)
from gpushare.core.model.topology import Distance, topology_annotation
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.port import KubeAPI
from gpushare.node.gpus import GpuSource, mem_units


class Published(Protocol):
    """What a node driver's settings give publishing: the node, its unit and resource names."""

    @property
    def node(self) -> str: ...

    @property
    def unit(self) -> MemoryUnit: ...

    @property
    def names(self) -> ResourceNames: ...


def topology_change(on_node: str | None, distance: Distance) -> Mapping[str, str | None]:
    """The annotation patch that makes the node hold ``distance``: {} when it already does."""
    wanted = topology_annotation(distance) if distance else None
    return {} if wanted == on_node else {ANN_NODE_TOPOLOGY: wanted}


async def publish(
    api: KubeAPI, source: GpuSource, config: Published, *, topology_on_node: str | None = None
) -> str | None:
    """Write the inventory, unit, hand-off marker, model labels and (when it changed) the
    topology on the node, and gpu-count in status; return the topology the node now holds.

    ``topology_on_node`` is the annotation's value as last read or written (None: absent).
    """
    found = source.gpus()
    topology = topology_change(topology_on_node, source.topology())
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
            **topology,
        },
        capacity={config.names.count: str(len(gpus))},
        labels={
            **gpu_node_labels([g.model for g in found], [g.memory_mib for g in found]),
            LABEL_NODE_GPUS_PUBLISHED: "true",
        },
    )
    return topology[ANN_NODE_TOPOLOGY] if topology else topology_on_node
