"""A pod's allocation and its annotations: the only record of who holds what.

The ledger is rebuilt from these annotations alone, so a restart of the extender loses nothing.
gpushare writes its own annotation (``gpushare.io/allocation``: per-container, per-GPU amounts
and the unit) plus the predecessor's five ``ALIYUN_COM_GPU_MEM_*`` keys, so existing device
plugins and tools keep working. Pods placed by the predecessor alone are read back from its keys.

Splitting a pod over N GPUs gives every container a share of each of the pod's GPUs, the same
for containers of equal size, which the hand-off needs (core.spreading chooses them); the pod
holds on each GPU what its containers' shares there add up to, counted as Kubernetes counts a
pod (init containers run before the others and reuse the same memory).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.core.containers import ContainerKind
from gpushare.core.kubejson import (
    KubeObject,
    annotations_of,
    name_of,
    namespace_of,
    spec_of,
    uid_of,
)
from gpushare.core.names import (
    ANN_ALLOCATION,
    ANN_ASSIGNED,
    ANN_ASSUME_TIME,
    ANN_DEV,
    ANN_IDX,
    ANN_POD,
)
from gpushare.core.requests import PodRequest
from gpushare.core.units import MemoryUnit

FORMAT_VERSION = 1


@dataclass(frozen=True)
class GpuShare:
    """An amount held on one GPU."""

    index: int
    mem_units: int
    core_pct: int = 0


@dataclass(frozen=True)
class ContainerShare:
    """What one container is served from, GPU by GPU."""

    name: str
    kind: ContainerKind
    gpus: tuple[GpuShare, ...]

    @property
    def mem_units(self) -> int:
        """The container's memory over all its GPUs."""
        return sum(share.mem_units for share in self.gpus)

    @property
    def core_pct(self) -> int:
        """The container's computing power over all its GPUs."""
        return sum(share.core_pct for share in self.gpus)


@dataclass(frozen=True)
class Allocation:
    """Who holds what on which GPUs of one node."""

    uid: str
    namespace: str
    name: str
    node: str
    unit: MemoryUnit
    gpus: tuple[GpuShare, ...]
    """The pod's holding per GPU (even, unless equal containers cannot split evenly)."""
    containers: tuple[ContainerShare, ...] = ()
    assigned: bool = False
    """True once the device plugin has served the pod."""
    assume_time_ns: int = 0

    @property
    def key(self) -> str:
        """``namespace/name`` for messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def mem_units(self) -> int:
        """The pod's memory over all its GPUs."""
        return sum(share.mem_units for share in self.gpus)

    @property
    def core_pct(self) -> int:
        """The pod's computing power over all its GPUs."""
        return sum(share.core_pct for share in self.gpus)

    @property
    def indexes(self) -> tuple[int, ...]:
        """The GPU indexes the pod holds."""
        return tuple(share.index for share in self.gpus)

    def same_placement(self, other: Allocation) -> bool:
        """Whether both put the pod on the same node with the same per-GPU amounts."""
        return self.node == other.node and self.gpus == other.gpus


def plan(
    request: PodRequest,
    *,
    node: str,
    indexes: Sequence[int],
    unit: MemoryUnit,
    assume_time_ns: int = 0,
) -> Allocation:
    """Split a valid request over the chosen GPUs of a node, position by position."""
    if len(indexes) != request.gpu_count:
        raise ValueError(f"pod {request.key} needs {request.gpu_count} GPUs, got {list(indexes)}")
    gpus = tuple(
        GpuShare(index=i, mem_units=m, core_pct=c)
        for i, m, c in zip(indexes, request.mem_holding, request.core_holding, strict=True)
    )
    containers = tuple(
        ContainerShare(
            name=container.name,
            kind=container.kind,
            gpus=tuple(
                GpuShare(index=i, mem_units=m, core_pct=c)
                for i, m, c in zip(indexes, mem, core, strict=True)
            ),
        )
        for container, mem, core in zip(
            request.containers, request.mem_layouts, request.core_layouts, strict=True
        )
    )
    return Allocation(
        uid=request.uid,
        namespace=request.namespace,
        name=request.name,
        node=node,
        unit=unit,
        gpus=gpus,
        containers=containers,
        assume_time_ns=assume_time_ns,
    )


def _share_json(share: GpuShare) -> dict[str, int]:
    return {"index": share.index, "mem": share.mem_units, "core": share.core_pct}


def to_annotations(allocation: Allocation, *, dev_units: int) -> dict[str, str]:
    """The annotations bind writes: gpushare's own record and the predecessor's keys.

    ``dev_units`` is the memory of one GPU on the node, for ``ALIYUN_COM_GPU_MEM_DEV``.
    """
    record = {
        "version": FORMAT_VERSION,
        "node": allocation.node,
        "unit": allocation.unit.value,
        "gpus": [_share_json(s) for s in allocation.gpus],
        "containers": [
            {"name": c.name, "kind": c.kind.value, "gpus": [_share_json(s) for s in c.gpus]}
            for c in allocation.containers
        ],
    }
    return {
        ANN_ALLOCATION: json.dumps(record, separators=(",", ":")),
        ANN_IDX: ",".join(str(i) for i in allocation.indexes),
        ANN_POD: str(allocation.mem_units),
        ANN_DEV: str(dev_units),
        ANN_ASSIGNED: "true" if allocation.assigned else "false",
        ANN_ASSUME_TIME: str(allocation.assume_time_ns),
    }


def _shares(raw: Any) -> tuple[GpuShare, ...]:
    if not isinstance(raw, list):
        raise ValueError("gpus must be a list")
    out = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise ValueError("each GPU share must be an object")
        values = [entry.get("index"), entry.get("mem"), entry.get("core", 0)]
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if len(numbers) != len(values):
            raise ValueError(f"GPU share {dict(entry)!r} needs integers index, mem, core >= 0")
        out.append(GpuShare(index=numbers[0], mem_units=numbers[1], core_pct=numbers[2]))
    return tuple(out)


def _int_annotation(annotations: Mapping[str, str], key: str) -> int:
    text = str(annotations.get(key, "")).strip()
    return int(text) if text.isdigit() else 0


def from_pod(pod: KubeObject) -> Allocation | None:
    """Read a pod's allocation from its annotations; None when it carries none.

    gpushare's own record wins; the predecessor's keys are the fallback. An unreadable record
    also returns None, and the ledger then treats the pod's memory as held on an unknown GPU.
    """
    annotations = annotations_of(pod)
    assigned = str(annotations.get(ANN_ASSIGNED, "")).lower() == "true"
    assume = _int_annotation(annotations, ANN_ASSUME_TIME)
    uid, namespace, name = uid_of(pod), namespace_of(pod), name_of(pod)
    if ANN_ALLOCATION in annotations:
        try:
            record = json.loads(str(annotations[ANN_ALLOCATION]))
            if not isinstance(record, Mapping):
                raise ValueError("record must be an object")
            containers = tuple(
                ContainerShare(
                    name=str(c.get("name", "")),
                    kind=ContainerKind(c.get("kind", "app")),
                    gpus=_shares(c.get("gpus")),
                )
                for c in record.get("containers") or []
            )
            return Allocation(
                node=str(record["node"]),
                unit=MemoryUnit.parse(str(record.get("unit", "1GiB"))),
                gpus=_shares(record.get("gpus")),
                containers=containers,
                uid=uid,
                namespace=namespace,
                name=name,
                assigned=assigned,
                assume_time_ns=assume,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
    node = str(spec_of(pod).get("nodeName") or "")
    idx_text = str(annotations.get(ANN_IDX, "")).strip()
    if not node or not idx_text or ANN_POD not in annotations:
        return None
    parts = idx_text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        return None
    indexes = [int(p) for p in parts]
    total = _int_annotation(annotations, ANN_POD)
    each = total // len(indexes)
    return Allocation(
        node=node,
        unit=MemoryUnit.GiB,
        gpus=tuple(GpuShare(index=i, mem_units=each) for i in indexes),
        uid=uid,
        namespace=namespace,
        name=name,
        assigned=assigned,
        assume_time_ns=assume,
    )
