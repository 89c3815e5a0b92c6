"""The node's ResourceSlice, kept as the driver's GPUs say: created, updated, the stale deleted.

One slice per node (``core.dra.slices.build_slice``: its pool is the node, one device per GPU in
service). The driver publishes it at start, again when a GPU's health changes (an unhealthy GPU
leaves the slice, so no allocator hands it out), when kubelet registers it, and checks it
every ``RECHECK_S``: kubelet deletes a node's slices when it starts and when a driver stays
unregistered for 30 s
(k8s v1.36.3 ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``, ``wipeResourceSlices``;
``pkg/kubelet/cm/dra/manager.go``, ``defaultWipingDelay``), so a slice can vanish under a
running driver.

Any other slice of this driver on this node (an older name, a second slice) is deleted: the pool
says it has one slice, and an allocator that saw two would count the GPUs twice. The pool's
generation goes up with every change of the devices, as the API asks of a pool that changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.dra.slices import SliceSpec, build_slice, gpus_from_slice, slice_name
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.kubejson import name_of
from gpushare.core.model.names import DRA_DRIVER
from gpushare.core.model.units import MemoryUnit
from gpushare.kube.port import Conflict, NotFound, SliceAPI
from gpushare.node.gpus import GpuInfo, mem_units

log = logging.getLogger(__name__)

RECHECK_S = 30.0
"""How often the slice is read back and re-created when kubelet (or anyone) deleted it: one list
call per node, so not too often; the driver also publishes when kubelet registers it, which
follows kubelet's own wipe at its start."""


def slice_gpus(gpus: Sequence[GpuInfo], unit: MemoryUnit) -> tuple[Gpu, ...]:
    """The GPUs as the slice publishes them (an unhealthy one is not in service)."""
    return tuple(
        Gpu(
            index=g.index,
            mem_units=mem_units(g, unit),
            healthy=g.healthy,
            uuid=g.uuid,
            model=g.model,
        )
        for g in gpus
    )


def _devices(obj: dict[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("devices")


def same_content(stored: dict[str, Any], wanted: SliceSpec) -> bool:
    """Whether a stored slice publishes what ``wanted`` does (read back the way the ledger reads
    it, so the API server's spelling of a quantity does not count as a change)."""
    read = gpus_from_slice(stored)
    if read is None:
        return False
    serving = sorted(
        (g.index, g.mem_units, g.uuid, g.model)
        for g in wanted.gpus
        if g.in_service and g.mem_units > 0
    )
    published = sorted((g.index, g.mem_units, g.uuid, g.model) for g in read.gpus)
    if published != serving:
        return False
    return not serving or (read.unit is wanted.unit and read.mode is wanted.mode)


async def publish_slice(
    api: SliceAPI,
    *,
    node: str,
    unit: MemoryUnit,
    mode: Mode,
    gpus: Sequence[GpuInfo],
    owner: Mapping[str, Any] | None = None,
    retry: bool = True,
) -> dict[str, Any]:
    """Make the node's slice say what ``gpus`` are; delete this driver's other slices there.

    ``owner`` is the Node object: the slice names it as its owner, so the garbage collector
    deletes the slice with the node. Returns the slice as the API server stored it. Raises
    KubeError when the API refuses.
    """
    name = slice_name(node)
    existing = await api.list_node_slices(node, DRA_DRIVER)
    for other in existing:
        if name_of(other) != name:
            try:
                await api.delete_resource_slice(name_of(other))
                log.info("slice=%s node=%s phase=delete stale", name_of(other), node)
            except NotFound:
                pass
    current = next((s for s in existing if name_of(s) == name), None)
    generation = int((((current or {}).get("spec") or {}).get("pool") or {}).get("generation", 0))
    spec = SliceSpec(node=node, unit=unit, mode=mode, gpus=slice_gpus(gpus, unit), generation=1)
    wanted = build_slice(spec)
    owner_uid = ((owner or {}).get("metadata") or {}).get("uid")
    if owner_uid:
        wanted["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid}
        ]
    if current is None:
        created = await api.create_resource_slice(wanted)
        log.info(
            "slice=%s node=%s devices=%d phase=create", name, node, len(_devices(wanted) or [])
        )
        return created
    if same_content(current, spec):
        return current
    wanted["spec"]["pool"]["generation"] = generation + 1
    wanted["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
    try:
        replaced = await api.replace_resource_slice(wanted)
    except (Conflict, NotFound):
        if not retry:
            raise
        # changed or deleted meanwhile (kubelet wipes a node's slices): read it again, once
        log.info("slice=%s node=%s phase=update changed meanwhile, read again", name, node)
        return await publish_slice(
            api, node=node, unit=unit, mode=mode, gpus=gpus, owner=owner, retry=False
        )
    log.info(
        "slice=%s node=%s devices=%d generation=%d phase=update",
        name,
        node,
        len(_devices(wanted) or []),
        generation + 1,
    )
    return replaced
