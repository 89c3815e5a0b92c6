"""The seeds' GPU nodes, as ``make cluster`` creates them for a person with plain kubectl.

The seed walkthrough expects one node, ``cn-zhangjiakou.192.168.66.139`` (IP 192.168.66.139),
labelled ``ack.node.gpu.schedule=share`` with one 15 GiB GPU, so that ``kubectl inspect cgpu``
prints ``0/15`` for it before the GPUtest Job and ``3/15`` after. The computing-power seed
adds a ``core_mem`` node (``ack.node.gpu.placement=binpack``) with 4 x 15 GiB GPUs and
capacity ``gpu-core.percentage: 400``, ``gpu-count: 4``, ``gpu-mem: 60``; its name is not in
the seed, so it takes the next address of the same subnet.

Capacities are what gpushare's device plugin reports for those GPUs at the chosen unit (whole
units per GPU, ``memory_mib // unit.mib``: 15 at 1 GiB, 120 at 128 MiB), and the nodes carry the
same inventory and unit annotations it writes, so the extender and ``kubectl inspect cgpu`` read
them exactly as they read a real node. They carry no ``gpushare.io/handoff`` marker: no device
plugin serves a kwok node, so no pod placed there would ever be marked served, and the marker
would keep later pods of another size waiting for that.

Pure: manifests and flag values in, manifests and values out.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.objects import gpu_node

SHARE_NODE = "cn-zhangjiakou.192.168.66.139"
SHARE_IP = "192.168.66.139"
CORE_NODE = "cn-zhangjiakou.192.168.66.140"
CORE_IP = "192.168.66.140"
GPU_MEMORY_MIB = 15 * 1024
"""Each seed GPU's memory: the seeds' ``0/15`` GiB per GPU."""
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_VALUE = "fake"
"""kwok manages only nodes annotated so (the cluster starts it with that selector)."""
UNITS = ", ".join(u.value for u in MemoryUnit)


def units_per_gpu(unit: MemoryUnit, memory_mib: int = GPU_MEMORY_MIB) -> int:
    """Whole units one GPU offers, as the device plugin counts them."""
    return memory_mib // unit.mib


def kwok_node(name: str, **kwargs: Any) -> dict[str, Any]:
    """A GPU node as the device plugin would describe it, managed by kwok."""
    node = gpu_node(name, **kwargs)
    node["metadata"]["annotations"][KWOK_ANNOTATION] = KWOK_VALUE
    return node


def seed_nodes(unit: MemoryUnit = MemoryUnit.GiB) -> list[dict[str, Any]]:
    """The seeds' ``share`` node (1 x 15 GiB) and ``core_mem`` node (4 x 15 GiB) at ``unit``."""
    per_gpu = units_per_gpu(unit)
    return [
        kwok_node(SHARE_NODE, ip=SHARE_IP, gpus_units=[per_gpu], mode=Mode.SHARE, unit=unit),
        kwok_node(
            CORE_NODE,
            ip=CORE_IP,
            gpus_units=[per_gpu] * 4,
            mode=Mode.CORE_MEM,
            placement="binpack",
            unit=unit,
        ),
    ]


def unit_option(text: str) -> MemoryUnit:
    """Read ``--unit`` (``make cluster UNIT=...``); a ValueError names the field, value and fix."""
    try:
        return MemoryUnit.parse(text)
    except ValueError:
        raise ValueError(
            f"UNIT={text!r} is refused: gpuMemoryUnit, the size of one aliyun.com/gpu-mem, "
            f"must be one of {UNITS}; run `make cluster` for 1GiB or `make cluster UNIT=128MiB` "
            f"for the 128 MiB seed example"
        ) from None


def labelled_kwok_nodes(names: list[str], label: str, **kwargs: Any) -> list[dict[str, Any]]:
    """kwok nodes carrying ``gpushare-e2e=<label>``, so a test's pods can select only them."""
    nodes = [kwok_node(name, **kwargs) for name in names]
    for node in nodes:
        node["metadata"]["labels"]["gpushare-e2e"] = label
    return nodes
