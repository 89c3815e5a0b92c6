"""What a node offers: its GPUs (each with its own memory size), mode, placement and unit.

The device plugin writes the per-GPU list (``gpushare.io/gpus``) and the unit
(``gpushare.io/gpu-mem-unit``) on the node, so heterogeneous cards and the 128 MiB unit are
never guessed. Nodes without that detail (installed by another device plugin) are derived from
``aliyun.com/gpu-mem`` / ``aliyun.com/gpu-count`` capacity, splitting memory evenly, which is the
best that can be known about them. A node whose detail is unreadable gets a ``problem`` instead
of GPUs, and the filter reports it as the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property
from typing import Any

from gpushare.core.model.disabling import parse_disabled
from gpushare.core.model.gpumodel import node_model
from gpushare.core.model.hostresources import NOTHING, HostResources, node_allocatable
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    embedded_json,
    internal_ip,
    labels_of,
    name_of,
    node_status_of,
)
from gpushare.core.model.names import (
    ANN_NODE_GPUS,
    ANN_NODE_GPUS_DISABLED,
    ANN_NODE_HANDOFF,
    ANN_NODE_TOPOLOGY,
    ANN_NODE_UNIT,
    DEFAULT_NAMES,
    HANDOFF_PODRESOURCES,
    LABEL_MODE,
    LABEL_PLACEMENT,
    ResourceNames,
)
from gpushare.core.model.quantity import parse_quantity
from gpushare.core.model.topology import Distance, parse_topology
from gpushare.core.model.units import MAX_GPU_MEMORY, MemoryUnit

CORE_PER_GPU = 100
"""Computing power of one GPU, in percent."""


class Mode(Enum):
    """Sharing mode from ``ack.node.gpu.schedule``."""

    SHARE = "share"
    """Sharing without isolation: the app limits itself from env variables."""
    CGPU = "cgpu"
    """Sharing with memory isolation."""
    CORE_MEM = "core_mem"
    """Sharing with memory and computing-power isolation."""
    MPS = "mps"
    """Memory-only sharing like cgpu, enforced by NVIDIA MPS (one GPU a pod)."""
    NONE = "none"
    """Any other value, or no label: the node is not shared."""

    @property
    def isolated(self) -> bool:
        """Whether the isolation layer runs (and its per-GPU pod limit applies)."""
        return self in (Mode.CGPU, Mode.CORE_MEM, Mode.MPS)

    @classmethod
    def from_label(cls, value: str | None) -> Mode:
        """Map a label value; unknown values mean not shared."""
        for mode in SHARED_MODES:
            if value == mode.value:
                return mode
        return cls.NONE


SHARED_MODES = (Mode.SHARE, Mode.CGPU, Mode.CORE_MEM, Mode.MPS)
"""The modes a node is shared in, in the order people are told them (every mode but NONE)."""


class Placement(Enum):
    """GPU choice inside a node, from ``ack.node.gpu.placement``."""

    BINPACK = "binpack"
    SPREAD = "spread"

    @classmethod
    def from_label(cls, value: str | None) -> Placement:
        """``spread`` when asked for; ``binpack`` otherwise (the seed's default)."""
        return cls.SPREAD if value == cls.SPREAD.value else cls.BINPACK


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the scheduler sees it."""

    index: int
    mem_units: int
    healthy: bool = True
    uuid: str = ""
    model: str = ""
    core_pct: int = CORE_PER_GPU
    disabled: bool = False
    """Taken out of service by the operator (``core.model.disabling``): its pods stay, none join."""

    @property
    def in_service(self) -> bool:
        """Whether new pods may be placed on it (healthy and not taken out of service)."""
        return self.healthy and not self.disabled


@dataclass(frozen=True)
class NodeInventory:
    """A node's shareable GPUs and the rules it is shared under."""

    name: str
    ip: str
    mode: Mode
    placement: Placement
    unit: MemoryUnit
    gpus: tuple[Gpu, ...]
    unit_declared: bool = False
    """True when the node carries the unit annotation (else the cluster unit was assumed)."""
    problem: str = ""
    """Why the GPU detail could not be read; empty when it could."""
    handoff: bool = False
    """Whether gpushare's device plugin serves the node (the hand-off invariant applies)."""
    host: HostResources = NOTHING
    """Allocatable CPU and memory (``core.model.hostresources``; nothing when the node does not
    say)."""
    model: str = ""
    """The GPU model label (``core.model.gpumodel``), else the first GPU's model; empty if
    unknown."""
    kubelet_mem_units: int | None = None
    """GPU memory kubelet reports allocatable (its devices registered and healthy); None when
    the node does not say. kube-scheduler leaves gpushare's resources to the extender
    (``ignoredByScheduler``), so the filter checks this as NodeResourcesFit would: a node whose
    device plugin has not registered yet, or whose devices are unhealthy, would have kubelet
    refuse the pod at admission (``UnexpectedAdmissionError``), which fails it for good."""
    distance: Distance = ()
    """Links between the GPUs, in ``gpus`` order (``core.model.topology``); () when not
    published."""
    topology_problem: str = ""
    """Why the published topology was not read (the node is placed without it)."""
    published: bool = False
    """Whether the node carries gpushare's inventory annotation (``gpushare.io/gpus``), which
    only gpushare's device plugin writes (``core.model.pluginserving``)."""

    @cached_property
    def kind(self) -> tuple[object, ...]:
        """Everything a decision reads from the node, without its name, address or GPU UUIDs.

        Nodes of one kind holding the same usage get the same verdict and score, so a filter
        over thousands of look-alike nodes decides each kind once (``Scheduler``).
        """
        return (
            self.mode.value,
            self.placement.value,
            self.unit.value,
            self.unit_declared,
            self.problem,
            self.handoff,
            tuple(
                (g.index, g.mem_units, g.healthy, g.model, g.core_pct, g.disabled)
                for g in self.gpus
            ),
            self.host,
            self.model,
            self.kubelet_mem_units,
            self.distance,
        )

    @cached_property
    def mem_units_total(self) -> int:
        """Memory of all GPUs, in units."""
        return sum(gpu.mem_units for gpu in self.gpus)

    @cached_property
    def _by_index(self) -> dict[int, Gpu]:
        return {gpu.index: gpu for gpu in self.gpus}

    @cached_property
    def position(self) -> dict[int, int]:
        """Each GPU index's row in ``distance``."""
        return {gpu.index: row for row, gpu in enumerate(self.gpus)}

    def gpu(self, index: int) -> Gpu | None:
        """The GPU with that index, if the node has it."""
        return self._by_index.get(index)


def _int_quantity(value: Any) -> int | None:
    """A whole number >= 0 in any spelling (``60``, ``"60"``, ``"+60"``, ``"1k"``), or None.

    kubelet writes 1000 devices as ``"1k"``, Quantity's canonical form, so suffixes count here.
    """
    parsed = parse_quantity(value)
    if isinstance(parsed, str) or parsed.value.denominator != 1 or parsed.value < 0:
        return None
    return int(parsed.value)


def _above_any_gpu(unit: MemoryUnit) -> str:
    return (
        f"is more than any GPU has (at most {unit.max_units} units of {unit.value}, "
        f"{MAX_GPU_MEMORY})"
    )


def _gpus_from_annotation(text: str, node: str, unit: MemoryUnit) -> tuple[tuple[Gpu, ...], str]:
    """Parse ``gpushare.io/gpus``; return GPUs or a problem message."""
    hint = f"node {node}: annotation {ANN_NODE_GPUS}"
    raw, problem = embedded_json(text)
    if problem:
        return (), f"{hint} {problem}; the device plugin must rewrite it"
    if not isinstance(raw, list) or not raw:
        return (), f"{hint} must be a non-empty JSON list of GPUs"
    gpus: list[Gpu] = []
    for position, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            return (), f"{hint}[{position}]={entry!r} must be an object"
        index = entry.get("index")
        mem = entry.get("memUnits")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return (), f"{hint}[{position}].index={index!r} must be an integer >= 0"
        if not isinstance(mem, int) or isinstance(mem, bool) or mem < 0:
            return (), f"{hint}[{position}].memUnits={mem!r} must be an integer >= 0"
        if mem > unit.max_units:
            return (), (
                f"{hint}[{position}].memUnits={mem} {_above_any_gpu(unit)}; the device plugin "
                f"must count memory in units of {unit.value}, not bytes: fix or restart it"
            )
        gpus.append(
            Gpu(
                index=index,
                mem_units=mem,
                healthy=bool(entry.get("healthy", True)),
                uuid=str(entry.get("uuid", "")),
                model=str(entry.get("model", "")),
            )
        )
    indexes = [gpu.index for gpu in gpus]
    if len(set(indexes)) != len(indexes):
        return (), f"{hint} lists a GPU index twice: {sorted(indexes)}"
    return tuple(sorted(gpus, key=lambda gpu: gpu.index)), ""


def _gpus_from_capacity(
    node: KubeObject, name: str, names: ResourceNames, unit: MemoryUnit
) -> tuple[tuple[Gpu, ...], str]:
    """Derive equal GPUs from capacity when the node carries no per-GPU detail."""
    status = node_status_of(node)
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    mem = _int_quantity(capacity.get(names.mem))
    count = _int_quantity(capacity.get(names.count))
    if mem is None and count is None:
        return (), f"node {name} reports no {names.mem} capacity and no {ANN_NODE_GPUS} annotation"
    if mem is None or count is None or count <= 0:
        return (), (
            f"node {name}: capacity {names.mem}={capacity.get(names.mem)!r}, "
            f"{names.count}={capacity.get(names.count)!r}; both are needed to know the GPUs "
            f"(or the device plugin's {ANN_NODE_GPUS} annotation)"
        )
    per_gpu = mem // count
    if per_gpu > unit.max_units:
        return (), (
            f"node {name}: capacity {names.mem}={capacity.get(names.mem)!r} over "
            f"{names.count}={capacity.get(names.count)!r} GPUs {_above_any_gpu(unit)}; the "
            f"device plugin must advertise one device per unit of {unit.value}, not per byte"
        )
    # Allocatable below capacity is how kubelet shows withdrawn (unhealthy) devices; without
    # per-GPU detail we cannot tell which GPU, so the whole node is treated as degraded only
    # when nothing is allocatable.
    alloc_mem = _int_quantity(allocatable.get(names.mem))
    healthy = alloc_mem is None or alloc_mem > 0
    return tuple(Gpu(index=i, mem_units=per_gpu, healthy=healthy) for i in range(count)), ""


def read_node(
    node: KubeObject,
    *,
    cluster_unit: MemoryUnit = MemoryUnit.GiB,
    names: ResourceNames = DEFAULT_NAMES,
) -> NodeInventory:
    """Build a node's inventory from its labels, annotations and capacity."""
    name = name_of(node)
    labels = labels_of(node)
    annotations = annotations_of(node)
    mode = Mode.from_label(labels.get(LABEL_MODE))
    placement = Placement.from_label(labels.get(LABEL_PLACEMENT))
    problem = ""
    unit = cluster_unit
    declared = ANN_NODE_UNIT in annotations
    if declared:
        try:
            unit = MemoryUnit.parse(str(annotations[ANN_NODE_UNIT]))
        except ValueError as err:
            problem = f"node {name}: annotation {ANN_NODE_UNIT}: {err}"
    gpus: tuple[Gpu, ...] = ()
    if not problem:
        if ANN_NODE_GPUS in annotations:
            gpus, problem = _gpus_from_annotation(str(annotations[ANN_NODE_GPUS]), name, unit)
        else:
            gpus, problem = _gpus_from_capacity(node, name, names, unit)
    if not problem and ANN_NODE_GPUS_DISABLED in annotations:
        disabled, problem = parse_disabled(
            str(annotations[ANN_NODE_GPUS_DISABLED]),
            node=name,
            indexes=[g.index for g in gpus],
        )
        gpus = tuple(replace(g, disabled=True) if g.index in disabled else g for g in gpus)
    distance: Distance = ()
    topology_problem = ""
    if not problem and ANN_NODE_TOPOLOGY in annotations and ANN_NODE_GPUS in annotations:
        distance, topology_problem = parse_topology(
            str(annotations[ANN_NODE_TOPOLOGY]), node=name, gpus=len(gpus)
        )
    return NodeInventory(
        name=name,
        ip=internal_ip(node),
        mode=mode,
        placement=placement,
        unit=unit,
        gpus=gpus,
        unit_declared=declared,
        problem=problem,
        handoff=annotations.get(ANN_NODE_HANDOFF) == HANDOFF_PODRESOURCES,
        host=node_allocatable(node),
        model=node_model(node) or next((g.model for g in gpus if g.model), ""),
        kubelet_mem_units=_int_quantity(
            (node_status_of(node).get("allocatable") or {}).get(names.mem)
        ),
        distance=distance,
        topology_problem=topology_problem,
        published=ANN_NODE_GPUS in annotations,
    )


def declared_unit(
    nodes: Iterable[KubeObject], *, default: MemoryUnit = MemoryUnit.GiB
) -> tuple[MemoryUnit, str]:
    """The cluster's gpu-mem unit as its nodes declare it, and a note when they disagree.

    gpushare's device plugin writes its unit on the node (``gpushare.io/gpu-mem-unit``), so a
    reader such as ``kubectl inspect cgpu`` needs no flag: the unit every declaring node names,
    else ``default`` (the seeds' 1 GiB, which ACK's plugin also assumes). Capacity alone cannot
    tell 15 GiB from 120 x 128 MiB, so nodes without the annotation do not vote. When nodes
    name different units, ``default`` is used for the others and the note says which is which
    (each declaring node is still read in its own unit).
    """
    seen: dict[MemoryUnit, list[str]] = {}
    for node in nodes:
        raw = annotations_of(node).get(ANN_NODE_UNIT)
        if raw is None:
            continue
        try:
            seen.setdefault(MemoryUnit.parse(str(raw)), []).append(name_of(node))
        except ValueError:
            continue  # read_node reports it as the node's problem
    if len(seen) == 1:
        return next(iter(seen)), ""
    if not seen:
        return default, ""
    listed = "; ".join(f"{unit.value}: {', '.join(sorted(names))}" for unit, names in seen.items())
    return default, (
        f"note: nodes declare different {ANN_NODE_UNIT} ({listed}); nodes without it are read "
        f"in {default.value}: give --unit to choose, and set gpuMemoryUnit the same everywhere"
    )


def inventory_annotation(gpus: tuple[Gpu, ...]) -> str:
    """Encode GPUs as the device plugin writes them into ``gpushare.io/gpus``."""
    return json.dumps(
        [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memUnits": gpu.mem_units,
                "healthy": gpu.healthy,
            }
            for gpu in gpus
        ],
        separators=(",", ":"),
    )
