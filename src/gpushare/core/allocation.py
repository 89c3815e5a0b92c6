"""A pod's allocation and its annotations: the only record of who holds what.

The ledger is rebuilt from these annotations alone, so a restart of the extender loses nothing.
gpushare writes its own annotation (``gpushare.io/allocation``: per-container, per-GPU amounts
and the unit) plus the predecessor's five ``ALIYUN_COM_GPU_MEM_*`` keys, so existing device
plugins and tools keep working. Pods placed by the predecessor alone are read back from its keys.

Splitting a pod over N GPUs gives every container an even share of each of the pod's GPUs (so
containers of equal size get equal layouts, which the hand-off needs); what does not divide by N
is laid end to end on a tape that is cut into N equal pieces, so each GPU still gets exactly the
pod's per-GPU share. Init containers run before the app containers and reuse the same memory,
so each gets its own split.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from gpushare.core.requests import ContainerKind, ContainerRequest, PodRequest
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
    """The pod's holding per GPU (its effective amount split evenly)."""
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


def _cut(lengths: Sequence[int], pieces: int, total: int) -> list[list[int]]:
    """Lay ``lengths`` end to end and cut ``[0, total)`` into ``pieces`` near-equal parts.

    Returns, per item, how much of it falls in each part.
    """
    bounds = [total * k // pieces for k in range(pieces + 1)]
    out: list[list[int]] = []
    start = 0
    for length in lengths:
        end = start + length
        out.append([max(0, min(end, bounds[k + 1]) - max(start, bounds[k])) for k in range(pieces)])
        start = end
    return out


def plan(
    request: PodRequest,
    *,
    node: str,
    indexes: Sequence[int],
    unit: MemoryUnit,
    assume_time_ns: int = 0,
) -> Allocation:
    """Split a valid request over the chosen GPUs of a node."""
    count = len(indexes)
    gpus = tuple(
        GpuShare(index=i, mem_units=request.mem_per_gpu, core_pct=request.core_per_gpu)
        for i in indexes
    )
    shares: dict[int, ContainerShare] = {}

    def split(amounts: list[int]) -> list[list[int]]:
        """Each amount evenly over the GPUs; the remainders laid on one tape and cut."""
        bases = [a // count for a in amounts]
        rests = [a - b * count for a, b in zip(amounts, bases, strict=True)]
        cut = _cut(rests, count, sum(rests))
        return [[b + r for r in parts] for b, parts in zip(bases, cut, strict=True)]

    def lay(group: list[tuple[int, ContainerRequest]]) -> None:
        if not group:
            return
        mem_cut = split([c.mem_units for _, c in group])
        core_cut = split([c.core_pct for _, c in group])
        for (position, container), mem_parts, core_parts in zip(
            group, mem_cut, core_cut, strict=True
        ):
            shares[position] = ContainerShare(
                name=container.name,
                kind=container.kind,
                gpus=tuple(
                    GpuShare(index=i, mem_units=m, core_pct=c)
                    for i, m, c in zip(indexes, mem_parts, core_parts, strict=True)
                ),
            )

    running = [(p, c) for p, c in enumerate(request.containers) if c.kind is not ContainerKind.INIT]
    lay(running)
    for position, container in enumerate(request.containers):
        if container.kind is ContainerKind.INIT:
            lay([(position, container)])
    return Allocation(
        uid=request.uid,
        namespace=request.namespace,
        name=request.name,
        node=node,
        unit=unit,
        gpus=gpus,
        containers=tuple(shares[p] for p in sorted(shares)),
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
